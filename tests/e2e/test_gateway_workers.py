"""``llmgw gateway --workers 2`` end to end: a real `llmgw serve`, a real agent running sim
engines, a real gateway of two worker processes on one port, and the official OpenAI
client. Both workers serve (each with its routing table from the control plane), the
metrics any of them answers are the sum of both, a worker that dies is started again,
and SIGTERM lets a stream in flight finish before every process exits 0.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from openai.types.chat import ChatCompletionMessageParam
from sqlalchemy import select

from autoscale.store import reports_t
from events.database.connection import make_engine
from tests.e2e.agents import eventually
from tests.e2e.gateways import GatewayProc, gateway_cluster
from tests.e2e.test_gateway import ROUNDS, chat

pytestmark = pytest.mark.slow

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Who answers?"}]


def _workers(gw: GatewayProc) -> list[psutil.Process]:
    """The supervisor's live children (a killed one is a zombie until it is reaped)."""
    assert gw.proc is not None
    out = []
    for p in psutil.Process(gw.proc.pid).children():
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _ok_total(gw: GatewayProc) -> float:
    text = gw.get("/metrics").text
    found = re.search(
        r'^llmgw_gateway_requests_total\{model="chat",outcome="ok"\} (\S+)$', text, re.M
    )
    return float(found.group(1)) if found else 0.0


def _prefix(gw: GatewayProc, token: str) -> str | None:
    """The request id's worker part (its first 8 hex digits), on a new connection; None
    from a worker still starting (no table yet: it says so, 503 ``gateway_starting``)."""
    with httpx.Client(base_url=gw.url, timeout=60) as one:
        answer = one.post(
            "/v1/chat/completions",
            json={"model": "chat", "messages": HI, "max_tokens": 2},
            headers={"Authorization": f"Bearer {token}"},
        )
    if answer.status_code == 503 and '"gateway_starting"' in answer.text:
        return None
    assert answer.status_code == 200, answer.text
    return answer.headers["x-request-id"][:8]


def _a_worker_beyond(gw: GatewayProc, token: str, known: set[str]) -> tuple[str, int]:
    """The prefix of the first worker not in ``known`` to answer a request, and how many
    requests were answered (by any worker) until then. Each request is on a new
    connection, so any worker may take it; one still starting is asked again."""
    answered = 0
    deadline = time.monotonic() + 90  # a bound on a hang, not on speed
    while True:
        found = _prefix(gw, token)
        if found is not None:
            answered += 1
            if found not in known:
                return found, answered
        assert time.monotonic() < deadline, (
            f"no worker but {sorted(known)} answered ({answered} answers)"
        )
        if found is None:
            time.sleep(0.1)


def test_two_workers_serve_one_port_share_metrics_restart_and_drain(
    tmp_path: Path, sqlite_url: str
) -> None:
    with gateway_cluster(
        tmp_path,
        sqlite_url,
        ["n1"],
        [chat(1, fallbacks=())],
        ROUNDS,
        gateway_args=("--workers", "2"),
    ) as (c, gw, t):
        c.agent("n1")
        first = _workers(gw)
        assert len(first) == 2
        # Each worker follows the control plane on its own: ask until a run of answers
        # (from either) all have the replica, then both have it.
        eventually(lambda: all(gw.ready("chat", 1) for _ in range(10)), "chat ready at both")
        client = gw.openai(t.client)

        # Both workers take connections: each request on a new connection, until the
        # request ids show two workers (each has its own prefix). The readiness check
        # above may have reached only one of them (on a busy machine the other can
        # still be fetching its first table): a worker still starting is asked again.
        one, sent = _a_worker_beyond(gw, t.client, set())
        other, answered = _a_worker_beyond(gw, t.client, {one})
        sent += answered

        # The official client, 4 threads at once: every answer whole.
        failures: list[Exception] = []

        def calls() -> None:
            for _ in range(10):
                try:
                    got = client.chat.completions.create(model="chat", messages=HI, max_tokens=3)
                    assert got.choices[0].message.content
                except Exception as exc:
                    failures.append(exc)

        threads = [threading.Thread(target=calls) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert failures == []
        sent += 40
        # Whichever worker answers the scrape, the count is both workers' requests. A
        # worker counts a request after its last byte is written: the other worker may
        # answer a scrape before that worker has run again, so the count is waited for.
        eventually(lambda: {_ok_total(gw) for _ in range(6)} == {float(sent)}, f"{sent} ok counted")

        def idle() -> str | None:
            text = gw.get("/metrics").text
            return text if 'llmgw_gateway_inflight{model="chat"} 0.0' in text else None

        metrics = eventually(idle, "no request in flight")
        assert "llmgw_gateway_control_plane_up 1.0" in metrics
        assert 'llmgw_gateway_ready_replicas{model="chat"} 1.0' in metrics

        # A worker killed outright is started again; the totals keep its requests.
        first[0].kill()
        eventually(lambda: gw.logs("gateway.worker_died"), "the supervisor saw it die")
        eventually(
            lambda: len(live := _workers(gw)) == 2 and first[0].pid not in {p.pid for p in live},
            "the killed worker started again",
        )
        # The new worker (a new prefix) answers: until it has its table, it says 503.
        _, answered = _a_worker_beyond(gw, t.client, {one, other})
        sent += answered
        assert client.chat.completions.create(model="chat", messages=HI, max_tokens=2).choices
        eventually(lambda: _ok_total(gw) == float(sent + 1), f"{sent + 1} ok counted")

        # SIGTERM during a stream: the stream finishes whole, then every process exits 0.
        stream = client.chat.completions.create(
            model="chat", messages=HI, max_tokens=60, stream=True
        )
        chunks: list[Any] = [next(stream)]
        workers = _workers(gw)
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        chunks += list(stream)
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert len(text.split()) == 60
        assert gw.proc.wait(60) == 0
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers)
        stopped = gw.logs("gateway.worker_stopped")
        assert sorted(e["code"] for e in stopped) == [0, 0]
        # Each worker posted its signal windows (at least its last, on SIGTERM) as the
        # control plane names it: the token's name and the worker's number, not its --id.
        engine = make_engine(c.server.db_url)
        try:
            with engine.connect() as conn:
                posters = set(conn.execute(select(reports_t.c.gateway)).scalars())
        finally:
            engine.dispose()
        assert posters == {"gw-1-w0", "gw-1-w1"}
