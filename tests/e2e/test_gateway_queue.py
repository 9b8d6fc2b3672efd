"""The gateway's queue end to end: a real `llmgw serve`, an agent running a sim engine with
one slot (``--slots 1``), a real `llmgw gateway`, client tokens issued with the real
`llmgw token new --priority-class`, and the official OpenAI client.

With the replica's one slot held, requests wait in the gateway's queue: a critical
client goes ahead of batch requests that came before it, a full queue answers 429
``queue_full`` and a wait past the client's timeout 503 ``queue_timeout`` (both with
Retry-After), and ``/routing``, ``/metrics`` and the request's log line show the queue.
Waits are on conditions (/routing, the log), never on sleeps; bounds only catch hangs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.agents import eventually
from tests.e2e.cli import Cli
from tests.e2e.gateways import GatewayProc, gateway_cluster

pytestmark = pytest.mark.slow

ROUNDS = ["--with-scheduler", "--interval", "0.3", "--stream-poll", "0.1"]
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Who goes first?"}]
# One slot, a token every 20 ms: a 1000-token answer holds the slot for 20 s or more.
FULL = {
    "name": "full",
    "source": "sim/full",
    "scaling": {"min": 1, "max": 1},
    "context_length": 8192,
    "max_output": 4096,
    "profiles": [
        {
            "name": "sim",
            "engine": "sim",
            "gpu_class": "SIM",
            "args": ["--slots", "1", "--token-delay", "0.02"],
        }
    ],
}
QUEUE_ARGS = ("--queue-max-length", "3", "--queue-max-wait", "60s", "--queue-starvation", "10m")


def issue(cli: Cli, name: str, *extra: str) -> str:
    done = cli("token", "new", name, "--role", "client", "--actor", "alice", *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[0]


def queue_of(gw: GatewayProc) -> dict[str, Any] | None:
    found: dict[str, Any] | None = gw.routing()["models"]["full"]["queue"]
    return found


def inflight(gw: GatewayProc) -> int:
    return sum(r["inflight"] for r in gw.routing()["models"]["full"]["replicas"])


class Background:
    """A request in a thread of its own: when it finished, and how."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.done_at: float | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            call()
        except BaseException as exc:  # kept for the assertion below
            self.error = exc
        self.done_at = time.monotonic()

    def wait(self) -> float:
        self.thread.join(120)
        assert not self.thread.is_alive(), "a request never came back"
        assert self.error is None, self.error
        assert self.done_at is not None
        return self.done_at


def test_a_critical_client_goes_ahead_of_waiting_batch_requests_and_the_bounds_answer(
    tmp_path: Path, sqlite_url: str
) -> None:
    with gateway_cluster(tmp_path, sqlite_url, ["n1"], [FULL], ROUNDS, gateway_args=QUEUE_ARGS) as (
        c,
        gw,
        t,
    ):
        c.agent("n1")
        eventually(lambda: gw.ready("full", 1), "the model ready at the gateway")
        # The replica's slots, from the profile's --slots, as the gateway counts them.
        assert gw.routing()["models"]["full"]["replicas"][0]["slots"] == 1
        cli = Cli(tmp_path, sqlite_url)
        crit = issue(cli, "crit", "--priority-class", "critical")
        bulk = issue(cli, "bulk", "--priority-class", "batch", "--share", "2")
        eventually(lambda: _takes(gw, crit) and _takes(gw, bulk), "the gateway takes both")

        def ask(token: str, n: int, **kw: Any) -> Callable[[], Any]:
            client = gw.openai(token)
            return lambda: client.chat.completions.create(
                model="full", messages=HI, max_tokens=n, **kw
            )

        # The one slot held by a long answer (20 s or more: the steps below must all
        # happen while it is held, on a loaded machine too); then two batch requests
        # wait for it.
        holder = Background(ask(t.client, 1000))
        eventually(lambda: inflight(gw) == 1, "the slot taken")
        batch = [Background(ask(bulk, 2)) for _ in range(2)]
        eventually(lambda: (q := queue_of(gw)) and q["length"] == 2, "two batch requests queued")
        queue = queue_of(gw)
        assert queue is not None
        assert queue["classes"]["batch"]["length"] == 2
        assert queue["clients"]["bulk"]["length"] == 2
        assert queue["oldest_wait_s"] >= 0
        metrics = gw.get("/metrics").text
        assert 'llmgw_gateway_queue_length{model="full",priority="batch"} 2.0' in metrics

        # A critical request, later than both, asking to be critical: it keeps its class.
        critical = Background(ask(crit, 2))
        eventually(lambda: (q := queue_of(gw)) and q["length"] == 3, "the critical one queued")
        assert queue_of(gw)["classes"]["critical"]["length"] == 1  # type: ignore[index]

        # The queue is full (3) of requests of batch's class or above: 429 queue_full.
        with pytest.raises(openai.RateLimitError) as caught:
            gw.openai(bulk).chat.completions.create(
                model="full",
                messages=HI,
                max_tokens=2,
                extra_headers={"x-llmgw-priority-class": "critical"},  # never raised
            )
        assert caught.value.status_code == 429
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "queue_full"
        assert "'full'" in caught.value.message and "queue_max_length" in caught.value.message
        assert int(caught.value.response.headers["retry-after"]) >= 1

        holder.wait()
        critical_done = critical.wait()
        assert all(critical_done < b.wait() for b in batch), "a batch request went first"

        lines = {
            line["client"]: line
            for line in gw.logs("gateway.request")
            if line["client"] in ("crit", "bulk") and line["status"] == 200
        }
        assert lines["crit"]["priority"] == "critical" and lines["crit"]["queued_ms"] > 0
        assert lines["bulk"]["priority"] == "batch" and lines["bulk"]["queued_ms"] > 0
        refused = [
            line
            for line in gw.logs("gateway.request")
            if line["client"] == "bulk" and line["status"] == 429
        ]
        assert refused and refused[0]["priority"] == "batch"  # asked critical, stayed batch
        assert 'llmgw_gateway_queue_wait_seconds_count{model="full",priority="critical"} 1.0' in (
            gw.get("/metrics").text
        )

        # A wait past the client's own timeout (the SDK's x-stainless-read-timeout):
        # 503 queue_timeout with Retry-After, while the slot is still held. A critical
        # client may lower its request's class.
        holder = Background(ask(t.client, 400))
        eventually(lambda: inflight(gw) == 1, "the slot taken again")
        with pytest.raises(openai.APIStatusError) as timed_out:
            gw.openai(crit).chat.completions.create(
                model="full",
                messages=HI,
                max_tokens=2,
                extra_headers={"x-stainless-read-timeout": "1", "x-llmgw-priority-class": "batch"},
            )
        assert timed_out.value.status_code == 503
        body = timed_out.value.body
        assert isinstance(body, dict) and body["code"] == "queue_timeout"
        assert int(timed_out.value.response.headers["retry-after"]) >= 1
        holder.wait()
        late = [
            line
            for line in gw.logs("gateway.request")
            if line["client"] == "crit" and line["status"] == 503
        ]
        assert late and late[0]["priority"] == "batch"


def _takes(gw: GatewayProc, token: str) -> bool:
    try:
        gw.openai(token).models.list()
    except openai.AuthenticationError:
        return False
    return True
