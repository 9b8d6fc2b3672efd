"""The ``prefix`` routing profile end to end: a real `llmgw serve`, an agent with three
sim engines (each with its own simulated prefix cache, reporting
``usage.prompt_tokens_details.cached_tokens``), one and then two real gateways, and the
official OpenAI client. Waits are on conditions, never on sleeps."""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.agents import Cluster, eventually
from tests.e2e.gateways import GatewayProc, GatewayTokens, gateway_cluster

pytestmark = pytest.mark.slow

ROUNDS = ["--with-scheduler", "--interval", "0.3", "--stream-poll", "0.1"]
# One slot per engine and 50 ms a token: a burst of requests queues, so in-flight
# counts (the balance rule's input) build up.
CACHED = {
    "name": "cached",
    "source": "sim/cached",
    "scaling": {"min": 3, "max": 3},
    "context_length": 32768,
    "max_output": 512,
    "routing_profile": "prefix",
    "profiles": [
        {
            "name": "sim",
            "engine": "sim",
            "gpu_class": "SIM",
            "args": ["--slots", "1", "--token-delay", "0.05"],
        }
    ],
}
SYSTEM = "You answer questions about clusters of cards, briefly and exactly. " * 40


class Setup:
    def __init__(self, c: Cluster, gw: GatewayProc, tokens: GatewayTokens) -> None:
        self.c, self.gw, self.tokens = c, gw, tokens


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("gwprefix")
    shutil.copy(sqlite_template, work / "llmgw.db")
    with gateway_cluster(work, f"sqlite:///{work / 'llmgw.db'}", ["n1"], [CACHED], ROUNDS) as (
        c,
        gw,
        tokens,
    ):
        c.agent("n1", gpus="SIM:3")
        eventually(lambda: gw.ready("cached", 3), "three cached replicas at the gateway")
        yield Setup(c, gw, tokens)


def ask(gw: GatewayProc, token: str, messages: list[ChatCompletionMessageParam], **kw: Any) -> Any:
    return gw.openai(token).chat.completions.with_raw_response.create(
        model="cached", messages=messages, max_tokens=kw.pop("max_tokens", 2), **kw
    )


def test_a_conversation_stays_where_its_prefix_is_and_the_engine_reuses_it(setup: Setup) -> None:
    gw, token = setup.gw, setup.tokens.client
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": SYSTEM}]
    replicas, cached = [], []
    for turn in range(4):
        messages.append({"role": "user", "content": f"question {turn}: " + "why " * 60})
        raw = ask(gw, token, messages)
        answer = raw.parse()
        replicas.append(raw.headers["x-llmgw-replica"])
        details = answer.usage.prompt_tokens_details
        cached.append(details.cached_tokens if details else 0)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
    assert len(set(replicas)) == 1, replicas
    # The engine's own count: each turn finds more of the conversation cached.
    assert cached[0] == 0 and all(b > a for a, b in itertools.pairwise(cached)), cached
    home = replicas[0]
    view = {r["replica"]: r for r in gw.routing()["models"]["cached"]["replicas"]}
    prefix = view[home]["prefix"]
    assert prefix["checked"] >= 4 and prefix["cached_tokens"] >= sum(cached)
    assert prefix["predicted_cached_tokens"] > 0 and prefix["blocks"] > 0
    assert prefix["hit_rate"] is not None and prefix["hit_rate"] > 0
    metrics = gw.get("/metrics").text
    assert 'llmgw_gateway_prefix_predicted_tokens_total{model="cached"}' in metrics
    recent = gw.routing()["models"]["cached"]["recent"]
    assert recent[-1]["reason"].startswith("prefix: ")


def test_a_hot_prefix_spills_when_its_replica_is_loaded(setup: Setup) -> None:
    """Twelve requests of one prefix at once, each 20 tokens at 50 ms on one-slot
    engines: the balance rule keeps the hot replica within 2 in flight of the least
    loaded, so the burst is spread, not queued on one replica."""
    gw, token = setup.gw, setup.tokens.client
    hot: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "hot " + SYSTEM},
        {"role": "user", "content": "the same question"},
    ]
    ask(gw, token, hot)  # now cached on one replica

    def one(_: int) -> str:
        raw = ask(gw, token, hot, max_tokens=20, stream=True)
        for _event in raw.parse():
            pass
        return str(raw.headers["x-llmgw-replica"])

    with ThreadPoolExecutor(12) as pool:
        served = list(pool.map(one, range(12)))
    assert len(set(served)) >= 2, served
    # (Which rule spread it, the balance bound's "passed over" or a guess the engine's
    # count corrected, depends on how the burst's requests overlap on a busy machine: the
    # spread is the behaviour held here; the bound itself is tests/unit/gateway's.)


def fills_all(gw: GatewayProc) -> bool:
    """Whether ``gw`` knows of both gateways and may fill every slot of ``cached``: its
    deal, and the idle slots it may borrow."""
    routing = gw.routing()
    return routing["gateways"]["count"] == 2 and all(
        r["slots_dealt"] + r["slots_borrowable"] == r["slots"]
        for r in routing["models"]["cached"]["replicas"]
    )


def test_two_gateways_send_an_unseen_prefix_to_the_same_replica(
    setup: Setup, tmp_path: Path
) -> None:
    gw, token = setup.gw, setup.tokens.client
    other = GatewayProc(
        tmp_path, setup.c.server.url, setup.tokens.gateway_b, admin=setup.c.tokens.reader
    )
    other.start()
    try:
        eventually(lambda: other.ready("cached", 3), "the second gateway has the replicas")
        # Two gateways deal the 1-slot replicas' slots between them (2 and 1): each fills
        # a replica not dealt to it only while its engine says the slot is idle (two
        # readings: gateway.stages.borrow). The prefix's replica is the same choice at
        # both; each sends there once it may fill every replica.
        eventually(lambda: fills_all(other) and fills_all(gw), "both may fill every replica")
        # A pair counts when each gateway chose by the rendezvous hash among all three
        # replicas, as its reason says. The test's wait for "may fill every replica" and
        # the request are two moments: under load, an engine reading between them can
        # leave a replica full in one gateway's view, which then chooses among the other
        # two ("among 2"). Seen in full runs at load 10 (cached/0 at one gateway,
        # cached/1 at the other), twice in two sessions. Such a pair is a precondition
        # missed, not a disagreement; a few are allowed, then the test fails.
        pairs: list[tuple[str, str]] = []
        missed: list[tuple[str, str, str, str]] = []
        for i in range(14):
            if len(pairs) == 9:
                break
            conv: list[ChatCompletionMessageParam] = [
                {"role": "system", "content": f"tenant {i}: " + SYSTEM},
                {"role": "user", "content": f"first question of conversation {i}"},
            ]
            first = ask(other, token, conv).headers["x-llmgw-replica"]
            why_first = other.routing()["models"]["cached"]["recent"][-1]["reason"]
            eventually(lambda: fills_all(gw), "its slot idle again, as gw reads it")
            second = ask(gw, token, conv).headers["x-llmgw-replica"]
            why_second = gw.routing()["models"]["cached"]["recent"][-1]["reason"]
            among_all = "rendezvous of its first blocks among 3"
            if among_all in why_first and among_all in why_second:
                pairs.append((first, second))
            else:
                missed.append((first, why_first, second, why_second))
            eventually(lambda: fills_all(other), "idle again, as the other reads it")
        assert len(pairs) == 9, missed
        assert all(a == b for a, b in pairs), (pairs, missed)
        assert len({a for a, _ in pairs}) >= 2, pairs  # and the prefixes spread
    finally:
        other.stop()
