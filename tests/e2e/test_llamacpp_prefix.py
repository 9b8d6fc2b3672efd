"""The ``prefix`` profile on real llama.cpp engines: `llmgw serve` with the scheduler, two
CPU agents, two llama-server replicas of the tiny random-weight model, a real gateway
and the official OpenAI client. llama-server says what it reused of each prompt
(``usage.prompt_tokens_details.cached_tokens``, ``timings.cache_n``)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.agents import eventually
from tests.e2e.gateways import GatewayProc, GatewayTokens, gateway_cluster

pytestmark = [
    pytest.mark.llamacpp,
    pytest.mark.slow,
    pytest.mark.xdist_group("llamacpp_prefix"),
]

ROUNDS = ["--with-scheduler", "--interval", "0.3"]
SYSTEM = "You answer questions about clusters of cards, briefly and exactly. " * 8


def model(path: Path) -> dict[str, Any]:
    return {
        "name": "tinyp",
        "source": str(path),
        "context_length": 2048,
        "routing_profile": "prefix",
        "scaling": {"min": 2, "max": 2},
        "profiles": [
            {
                "name": "cpu",
                "engine": "llamacpp",
                "args": ["--ctx-size", "2048", "--parallel", "1", "--threads", "1"],
            }
        ],
    }


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    sqlite_template: Path,
    llama_server: str,
    tiny_gguf: Path,
) -> Iterator[tuple[GatewayProc, GatewayTokens]]:
    workdir = tmp_path_factory.mktemp("llamaprefix")
    db = workdir / "llmgw.db"
    db.write_bytes(sqlite_template.read_bytes())
    with gateway_cluster(workdir, f"sqlite:///{db}", ["n1", "n2"], [model(tiny_gguf)], ROUNDS) as (
        c,
        gw,
        t,
    ):
        for node in ("n1", "n2"):
            c.agent(node, gpus="none")
        eventually(lambda: gw.ready("tinyp", 2), "two llama.cpp replicas at the gateway", 180)
        yield gw, t


def test_a_conversation_stays_where_llama_cpp_holds_its_prefix(
    stack: tuple[GatewayProc, GatewayTokens],
) -> None:
    gw, tokens = stack
    client = gw.openai(tokens.client)
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": SYSTEM}]
    replicas, cached = [], []
    for turn in range(3):
        messages.append({"role": "user", "content": f"question {turn}: " + "why " * 20})
        raw = client.chat.completions.with_raw_response.create(
            model="tinyp", messages=messages, max_tokens=4
        )
        answer = raw.parse()
        replicas.append(raw.headers["x-llmgw-replica"])
        details = answer.usage.prompt_tokens_details if answer.usage else None
        cached.append(details.cached_tokens or 0 if details else 0)
        messages.append({"role": "assistant", "content": "noted. " * 3})
    assert len(set(replicas)) == 1, replicas
    assert cached[1] > 0 and cached[2] > cached[1], cached  # the engine's own count
    view = {r["replica"]: r for r in gw.routing()["models"]["tinyp"]["replicas"]}
    prefix = view[replicas[0]]["prefix"]
    assert prefix["checked"] >= 3 and prefix["cached_tokens"] >= sum(cached)
    assert prefix["predicted_cached_tokens"] > 0


def test_a_hot_prefix_spills_to_the_other_llama_cpp_replica(
    stack: tuple[GatewayProc, GatewayTokens],
) -> None:
    """Ten streams of one prompt at once on one-slot engines, each 200 tokens: the hot
    replica queues, and past 2 in flight above the other the rest go to the other."""
    gw, tokens = stack
    # Both replicas ready at the gateway now (the module's first test ran on them; one
    # slow to answer on a loaded machine may have been set aside since).
    eventually(lambda: gw.ready("tinyp", 2), "two llama.cpp replicas at the gateway", 60)
    client = gw.openai(tokens.client)
    hot: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "hot " + SYSTEM},
        {"role": "user", "content": "the same question"},
    ]
    client.chat.completions.create(model="tinyp", messages=hot, max_tokens=1)

    def one(_: int) -> str:
        raw = client.chat.completions.with_raw_response.create(
            model="tinyp",
            messages=hot,
            max_tokens=200,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        for _event in raw.parse():
            pass
        return str(raw.headers["x-llmgw-replica"])

    with ThreadPoolExecutor(10) as pool:
        served = list(pool.map(one, range(10)))
    assert len(set(served)) == 2, (served, gw.routing().get("models", {}).get("tinyp"))
