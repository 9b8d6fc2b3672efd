"""Prefix and session routing against the gateway's slot queue, end to end (issue 41): a
real `llmgw serve`, an agent with sim engines of one slot each (``--slots 1``, each with
its simulated prefix cache reporting ``usage.prompt_tokens_details.cached_tokens``), a
real `llmgw gateway` and the official OpenAI client.

When the replica a request's profile chose for its cache is full, the request waits for
*that* replica's slot (a hold) instead of taking whichever slot frees first, within the
balance bound (a hot prefix still spills) and ``queue_hold``. Waits are on conditions,
never on sleeps; the long answers only keep a slot busy while the steps happen."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.agents import Cluster, eventually
from tests.e2e.gateways import GatewayProc, GatewayTokens, gateway_cluster

pytestmark = pytest.mark.slow

ROUNDS = ["--with-scheduler", "--interval", "0.3", "--stream-poll", "0.1"]
# One slot per engine, 50 ms a token: a 200-token answer holds its slot 10 s or more.
SIM = {"name": "sim", "engine": "sim", "gpu_class": "SIM"}
ARGS = ["--slots", "1", "--token-delay", "0.05"]
MODELS = [
    {
        "name": name,
        "source": f"sim/{name}",
        "scaling": {"min": 2, "max": 2},
        "context_length": 32768,
        "max_output": 512,
        "routing_profile": profile,
        "profiles": [{**SIM, "args": ARGS}],
    }
    for name, profile in (("held", "prefix"), ("keyed", "session"))
]
# The hold outlasts the long answers below, so the test does not depend on the
# machine's speed (the default is 5 s). No slow start: the second replica to be ready
# joins warming, and for its first 10 s one request in flight counts as more than the
# balance bound above an idle replica, so a conversation whose home it is would spill
# (CI, on a slow machine: the next turn went to the other replica).
GATEWAY_ARGS = ("--queue-hold", "60s", "--queue-starvation", "2m", "--slow-start", "0")
SYSTEM = "You answer questions about clusters of cards, briefly and exactly. " * 40


Setup = tuple[GatewayProc, GatewayTokens, Cluster]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("gwprefixslots")
    shutil.copy(sqlite_template, work / "llmgw.db")
    with gateway_cluster(
        work,
        f"sqlite:///{work / 'llmgw.db'}",
        ["n1"],
        MODELS,
        ROUNDS,
        gateway_args=GATEWAY_ARGS,
    ) as (c, gw, tokens):
        c.agent("n1", gpus="SIM:4")
        eventually(lambda: gw.ready("held", 2), "two prefix replicas at the gateway")
        eventually(lambda: gw.ready("keyed", 2), "two session replicas at the gateway")
        yield gw, tokens, c


def ask(
    gw: GatewayProc, token: str, model: str, messages: list[ChatCompletionMessageParam], **kw: Any
) -> Any:
    return gw.openai(token).chat.completions.with_raw_response.create(
        model=model, messages=messages, max_tokens=kw.pop("max_tokens", 2), **kw
    )


class Streamed:
    """A streamed request in a thread of its own: the replica it went to (known at its
    first token, when the gateway sends its headers), then read to its end."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.replica: str | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            raw = call()
            self.replica = raw.headers["x-llmgw-replica"]
            for _event in raw.parse():
                pass
        except BaseException as exc:  # kept for the assertion in join
            self.error = exc

    def join(self) -> None:
        self.thread.join(120)
        assert not self.thread.is_alive() and self.error is None, self.error


def replicas_of(gw: GatewayProc, model: str) -> dict[str, dict[str, Any]]:
    return {r["replica"]: r for r in gw.routing()["models"][model]["replicas"]}


def test_with_every_slot_busy_a_conversations_next_turn_waits_for_its_prefixs_replica(
    setup: Setup,
) -> None:
    gw, tokens, _ = setup
    token = tokens.client
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "question one: " + "why " * 60},
    ]
    first = ask(gw, token, "held", messages)
    home = first.headers["x-llmgw-replica"]
    messages.append({"role": "assistant", "content": first.parse().choices[0].message.content})
    # Home's one slot taken by a long answer in the same conversation (sent there: its
    # prefix is there and the slot is free), the other replica's by an unrelated prompt
    # (home is full and the prompt is held nowhere: any free slot, as before). The
    # other answer is the shorter: its slot frees first.
    busy_home = Streamed(
        lambda: ask(
            gw,
            token,
            "held",
            [*messages, {"role": "user", "content": "tell me more"}],
            max_tokens=200,
            stream=True,
        )
    )
    eventually(lambda: busy_home.replica is not None, "home's slot taken")
    assert busy_home.replica == home
    busy_other = Streamed(
        lambda: ask(
            gw,
            token,
            "held",
            [{"role": "user", "content": "something unrelated " * 30}],
            max_tokens=20,
            stream=True,
        )
    )
    eventually(lambda: busy_other.replica is not None, "the other replica's slot taken")
    other = busy_other.replica
    assert other != home

    # The conversation's next turn: both slots busy. It waits for home's slot, not the
    # other's, which frees first.
    messages.append({"role": "user", "content": "question two: " + "how " * 60})
    second = ask(gw, token, "held", messages)
    assert second.headers["x-llmgw-replica"] == home
    details = second.parse().usage.prompt_tokens_details
    assert details is not None and details.cached_tokens > 0  # the engine's own count
    busy_home.join()
    busy_other.join()

    held = replicas_of(gw, "held")[home]["slot_hold"]
    assert held["waited"] >= 1 and held["holding"] == 0, held
    queued = [x for x in gw.logs("gateway.queued") if x.get("holds_for") == home]
    assert queued, "the turn's wait names the replica it held for"


def test_a_hot_prefix_still_spills_past_the_balance_bound(
    setup: Setup,
) -> None:
    """Ten requests of one prefix at once on two one-slot replicas: a few wait for the
    replica holding the prefix (the bound: its in-flight requests and holders at most 2
    above the other's), the rest spill to the other replica."""
    gw, tokens, _ = setup
    token = tokens.client
    hot: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "hot " + SYSTEM},
        {"role": "user", "content": "the same question " * 20},
    ]
    x = ask(gw, token, "held", hot).headers["x-llmgw-replica"]
    before = replicas_of(gw, "held")[x].get("slot_hold") or {"waited": 0, "spilled": 0}

    def one(_: int) -> str:
        raw = ask(gw, token, "held", hot, max_tokens=20, stream=True)
        for _event in raw.parse():
            pass
        return str(raw.headers["x-llmgw-replica"])

    with ThreadPoolExecutor(10) as pool:
        served = list(pool.map(one, range(10)))
    assert len(set(served)) == 2, served
    after = replicas_of(gw, "held")[x]["slot_hold"]
    assert after["waited"] > before["waited"], (before, after)  # some waited for x
    assert after["spilled"] > before["spilled"], (before, after)  # the bound spilled some
    assert after["holding"] == 0


def test_a_session_keys_request_waits_for_its_replicas_slot(
    setup: Setup,
) -> None:
    gw, tokens, _ = setup
    token = tokens.client
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "a keyed question"},
    ]
    home = ask(gw, token, "keyed", messages, user="conversation-1").headers["x-llmgw-replica"]
    key = "conversation-1"
    busy = Streamed(
        lambda: ask(gw, token, "keyed", messages, user=key, max_tokens=200, stream=True)
    )
    eventually(lambda: busy.replica is not None, "the key's replica's slot taken")
    assert busy.replica == home
    # The other replica is free: before, the key went there while its own was full.
    again = ask(gw, token, "keyed", messages, user="conversation-1")
    assert again.headers["x-llmgw-replica"] == home
    busy.join()
    assert replicas_of(gw, "keyed")[home]["slot_hold"]["waited"] >= 1


def test_a_hold_ends_at_queue_hold_and_the_turn_takes_the_free_replica(
    setup: Setup, tmp_path: Path
) -> None:
    """A gateway with ``--queue-hold 1s``: the conversation's next turn waits for its
    replica's slot one second, then takes the other replica's free slot."""
    _, tokens, c = setup
    token = tokens.client
    gw = GatewayProc(
        tmp_path, c.server.url, tokens.gateway_b, "--queue-hold", "1s", admin=c.tokens.reader
    )
    gw.start()
    try:
        eventually(lambda: gw.ready("held", 2), "the second gateway has the replicas")
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": "short holds: " + SYSTEM},
            {"role": "user", "content": "question one: " + "what " * 60},
        ]
        first = ask(gw, token, "held", messages)
        home = first.headers["x-llmgw-replica"]
        messages.append({"role": "assistant", "content": first.parse().choices[0].message.content})
        busy = Streamed(
            lambda: ask(
                gw,
                token,
                "held",
                [*messages, {"role": "user", "content": "tell me more"}],
                max_tokens=200,
                stream=True,
            )
        )
        eventually(lambda: busy.replica is not None, "home's slot taken")
        assert busy.replica == home
        messages.append({"role": "user", "content": "question two: " + "when " * 60})
        second = ask(gw, token, "held", messages)
        assert second.headers["x-llmgw-replica"] != home  # (home is busy for 10 s or more)
        busy.join()
        held = replicas_of(gw, "held")[home]["slot_hold"]
        assert held["expired"] == 1 and held["waited"] == 0, held
        assert [x for x in gw.logs("gateway.hold_expired") if x["replica"] == home]
        line = [
            x
            for x in gw.logs("gateway.request")
            if x.get("replica") != home and x.get("status") == 200
        ][-1]
        # It held about a second first (the hold's timer and the line's clock are read a
        # fraction of a millisecond apart: 999.8 was seen).
        assert (line["queued_ms"] or 0) >= 990, line
    finally:
        gw.stop()
