"""A llama.cpp engine started with a key (``LLAMA_API_KEY: {secret: NAME}`` in its
profile's env), on llama.cpp's own server: `llmgw serve` with the scheduler, a CPU agent
with the secret in its ``--secrets-dir``, a gateway with its own copy, and the official
OpenAI client. The engine's key is llama-server's own check, not the sim's imitation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.agents import Cluster, eventually
from tests.e2e.gateways import GatewayProc, GatewayTokens, gateway_cluster

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

ROUNDS = ["--with-scheduler", "--interval", "0.3"]
KEY = "llama-k3y-for-the-gateway"


def model(path: Path) -> dict[str, Any]:
    return {
        "name": "tinyk",
        "source": str(path),
        "context_length": 2048,
        "scaling": {"min": 1, "max": 1},
        "profiles": [
            {
                "name": "cpu",
                "engine": "llamacpp",
                "args": ["--ctx-size", "2048", "--parallel", "2", "--threads", "1"],
                "env": {"LLAMA_API_KEY": {"secret": "engine-key"}},
            }
        ],
    }


Stack = tuple[GatewayProc, GatewayTokens, Cluster]


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    sqlite_template: Path,
    llama_server: str,
    tiny_gguf: Path,
) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("llamakey")
    db = workdir / "llmgw.db"
    db.write_bytes(sqlite_template.read_bytes())
    for side in ("agent", "gateway"):
        (workdir / side).mkdir()
        (workdir / side / "engine-key").write_text(KEY + "\n")
    with gateway_cluster(
        workdir,
        f"sqlite:///{db}",
        ["n1"],
        [model(tiny_gguf)],
        ROUNDS,
        gateway_args=("--secrets-dir", str(workdir / "gateway")),
    ) as (c, gw, t):
        c.agent("n1", "--secrets-dir", str(workdir / "agent"), gpus="none")
        eventually(lambda: gw.ready("tinyk", 1), "the keyed llama.cpp replica at the gateway", 180)
        yield gw, t, c


def test_llama_server_with_a_key_serves_the_gateway_and_refuses_a_request_around_it(
    stack: Stack,
) -> None:
    gw, tokens, c = stack
    answer = gw.openai(tokens.client).chat.completions.create(
        model="tinyk", messages=[{"role": "user", "content": "hello"}], max_tokens=3
    )
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    (placement,) = [p for p in c.placements() if p["model"] == "tinyk"]
    url = placement["endpoint"]
    body = {"model": "tinyk", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    around = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert around.status_code == 401, around.text
    with_client_token = httpx.post(
        url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {tokens.client}"},
        timeout=30,
    )
    assert with_client_token.status_code == 401, with_client_token.text


def test_the_gateway_and_the_agent_read_a_keyed_llama_server_with_its_key(stack: Stack) -> None:
    # /props needs the key on llama-server: the gateway's slots and the agent's context
    # read come from it, and stayed unknown without the key.
    gw, _, c = stack

    def slots() -> Any:
        (replica,) = gw.routing()["models"]["tinyk"]["replicas"]
        return replica.get("slots_source") == "engine" and replica

    found = eventually(slots, "the gateway's /props read of the keyed engine", 60)
    assert found["slots"] == 2
    eventually(
        lambda: c.states()[("tinyk", 0)].get("effective_context_length") == 1024,
        "the agent's /props read of the keyed engine (2048 / --parallel 2)",
        60,
    )


def test_engine_check_asks_a_keyed_engine_with_the_key_or_says_which_it_needs(
    stack: Stack,
) -> None:
    _, _, c = stack
    refused = c.cli("engine-check", "tinyk", "--json")
    assert refused.returncode == 1 and not refused.stdout, refused.stdout + refused.stderr
    assert "starts its engine with the key of secret 'engine-key'" in refused.stderr
    assert "--secrets-dir DIR" in refused.stderr and "--gateway URL" in refused.stderr
    secrets = c.workdir / "agent"
    checked = c.cli("engine-check", "tinyk", "--secrets-dir", str(secrets), "--json")
    report = json.loads(checked.stdout)
    # The engine's own /props, read with the key: 2048 / --parallel 2 a request.
    (context,) = [v for v in report["verdicts"] if v["claim"] == "context_length"]
    assert context["outcome"] == "refused" and "1024" in context["detail"], context
