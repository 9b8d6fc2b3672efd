"""Two gateways in front of the same replicas, end to end: a real `llmgw serve`, an agent
running two sim engines of one slot each (``--slots 1``), two real `llmgw gateway`s (each
its own token) and the official OpenAI client.

The gateways learn of each other from the control plane's answers to their signal posts
and deal each replica's slots among them (gateway.stages.slotshare): one 1-slot replica
each, where a fixed share of 0.5 gave each gateway a slot of both and every engine twice
the requests it runs. A gateway with no traffic lends its idle slot: the other reads the
engines' own counts and borrows it (gateway.stages.borrow), within the stated bound: the
engine holds more than its slots only until the borrowed request ends.
Waits are on conditions; the sampling windows are bounded by the answers' own length.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.agents import eventually
from tests.e2e.gateways import GatewayProc, gateway_cluster

pytestmark = pytest.mark.slow

ROUNDS = ["--with-scheduler", "--interval", "0.3", "--stream-poll", "0.1"]
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Whose slot is it?"}]
TOKEN_DELAY = 0.02
PAIR = {
    "name": "pair",
    "source": "sim/pair",
    "scaling": {"min": 2, "max": 2},
    "context_length": 8192,
    "max_output": 4096,
    "profiles": [
        {
            "name": "sim",
            "engine": "sim",
            "gpu_class": "SIM",
            "args": ["--slots", "1", "--token-delay", str(TOKEN_DELAY)],
        }
    ],
}
# Posted often, so that each learns of the other within a second.
SETTINGS = '[gateway]\nsignals_interval = "0.3s"\nslow_start = "0s"\n'


def replicas(gw: GatewayProc) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = gw.routing()["models"]["pair"]["replicas"]
    return found


def queued(gw: GatewayProc) -> int:
    queue = gw.routing()["models"]["pair"]["queue"]
    return 0 if queue is None else int(queue["length"])


def knows_both(gw: GatewayProc) -> bool:
    return bool(gw.routing()["gateways"]["count"] == 2)


def counts(endpoint: str) -> tuple[int, int]:
    """The engine's own (running, waiting), from its /metrics."""
    text = httpx.get(endpoint + "/metrics", timeout=10).text
    values = {
        line.split("{", 1)[0]: int(float(line.rsplit(None, 1)[1]))
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_")
    }
    return values["vllm:num_requests_running"], values["vllm:num_requests_waiting"]


class Sampler:
    """The engines' counts every 20 ms, in a thread: (time, endpoint, running, waiting)."""

    def __init__(self, endpoints: list[str]) -> None:
        self.endpoints = endpoints
        self.samples: list[tuple[float, str, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for e in self.endpoints:
                running, waiting = counts(e)
                self.samples.append((time.monotonic(), e, running, waiting))
            self._stop.wait(0.02)

    def stop(self) -> list[tuple[float, str, int, int]]:
        self._stop.set()
        self._thread.join(30)
        return self.samples


def streams(gw: GatewayProc, token: str, n: int, tokens: int) -> list[threading.Thread]:
    """``n`` streamed answers of ``tokens`` tokens through ``gw``, each in a thread."""

    def one() -> None:
        stream = gw.openai(token).chat.completions.create(
            model="pair", messages=HI, max_tokens=tokens, stream=True
        )
        for _ in stream:
            pass

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def joined(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "an answer never came back"


@pytest.fixture
def two(tmp_path: Path, sqlite_url: str) -> Iterator[tuple[GatewayProc, GatewayProc, str]]:
    settings = tmp_path / "gw.toml"
    settings.write_text(SETTINGS)
    args = ("--settings", str(settings))
    with gateway_cluster(tmp_path, sqlite_url, ["n1"], [PAIR], ROUNDS, gateway_args=args) as (
        c,
        a,
        t,
    ):
        c.agent("n1", gpus="SIM:2")
        b = GatewayProc(tmp_path, c.server.url, t.gateway_b, *args, admin=c.tokens.reader)
        b.start()
        try:
            for gw in (a, b):
                eventually(partial(gw.ready, "pair", 2), "both replicas at each gateway")
                eventually(partial(knows_both, gw), "each gateway knows of the other")
            yield a, b, t.client
        finally:
            b.stop()


def test_two_gateways_deal_1_slot_replicas_one_each_and_never_send_an_engine_twice_its_slots(
    two: tuple[GatewayProc, GatewayProc, str],
) -> None:
    a, b, token = two
    dealt = {gw: {r["replica"]: r["slots_dealt"] for r in replicas(gw)} for gw in (a, b)}
    keys = sorted(dealt[a])
    assert [dealt[a][k] + dealt[b][k] for k in keys] == [1, 1], dealt  # each slot once
    assert sum(dealt[a].values()) == sum(dealt[b].values()) == 1, dealt
    endpoints = [r["endpoint"] for r in replicas(a)]

    # Both gateways with a backlog: 10 answers of 1 s each through each, on 2 slots.
    service = 50 * TOKEN_DELAY
    sampler = Sampler(endpoints)
    started = time.monotonic()
    threads = streams(a, token, 10, 50) + streams(b, token, 10, 50)
    # Once both gateways queue (each has its backlog), and past the start's transient (a
    # gateway may borrow on readings taken while the other was idle: the bound's excess,
    # until that answer ends), for three service times while both still have a backlog.
    eventually(lambda: queued(a) >= 3 and queued(b) >= 3, "both gateways queue")
    settle = time.monotonic() + 2 * service + 0.5
    eventually(lambda: time.monotonic() > settle + 3 * service, "the backlog served a while")
    assert queued(a) and queued(b), "a backlog ran out: the window is not while both queue"
    window = [s for s in sampler.samples if settle <= s[0] <= settle + 3 * service]
    joined(threads)
    sampler.stop()
    assert len({e for _, e, _, _ in window}) == 2, "the engines were sampled"
    # Each engine runs its one slot, and nothing waits at it: the gateways queue the
    # rest themselves (a share of 0.5 sent each engine one request of each: one waited).
    assert max(r for _, _, r, _ in window) == 1
    over = [(round(t - started, 2), e, r, w) for t, e, r, w in window if w > 0]
    assert not over, f"{len(over)} of {len(window)} samples had a request waiting: {over[:20]}"


def test_a_gateway_borrows_the_idle_slot_of_the_other_within_the_bound(
    two: tuple[GatewayProc, GatewayProc, str],
) -> None:
    a, b, token = two
    mine = {r["replica"]: r for r in replicas(a)}
    (theirs,) = [k for k, r in mine.items() if r["slots_dealt"] == 0]
    # b has no traffic: a reads that its replica's slot is idle and may fill it.
    eventually(
        lambda: {r["replica"]: r for r in replicas(a)}[theirs]["slots_borrowable"] == 1,
        "a may borrow b's idle slot",
    )
    # Two answers of 3 s through a: both slots run them, none waits at a.
    held = streams(a, token, 2, 150)
    eventually(lambda: all(r["inflight"] == 1 for r in replicas(a)), "a runs one on each replica")
    endpoint = mine[theirs]["endpoint"]
    # Then b's own traffic: its request waits at the engine for the borrowed answer only
    # (the bound: at most one service time), and a borrows that slot no more.
    sampler = Sampler([endpoint])
    started = time.monotonic()
    stream = b.openai(token).chat.completions.create(
        model="pair", messages=HI, max_tokens=2, stream=True
    )
    next(iter(stream))
    first_token = time.monotonic() - started
    for _ in stream:
        pass
    samples = sampler.stop()
    assert first_token < 150 * TOKEN_DELAY + 2.0
    assert max(w for _, _, _, w in samples) <= 1  # the excess: the one borrowed answer
    joined(held)
    eventually(
        lambda: {r["replica"]: r for r in replicas(a)}[theirs]["slots_borrowable"] == 1,
        "b idle again: its slot lendable again",
    )
    assert any(x["gateways"] == 2 for x in a.logs("gateway.members"))
