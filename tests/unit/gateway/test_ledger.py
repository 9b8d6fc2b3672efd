"""The gateway's usage ledger (``gateway.stages.ledger``) and its flushes
(``gateway.ledger``).

Whatever requests finish, in any order: every flush's rows are accepted by the control
plane's reading (``events.core.usage.check_usage``, the contract), and their sums per
client and model are exactly the tokens and requests recorded. A flush the control plane
did not answer is sent again with the same id (recorded once there), counts made
meanwhile are not lost, and a refused one is dropped and named. Over real HTTP.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from events.core.usage import check_usage
from gateway.ledger import Flusher
from gateway.stages.ledger import Ledger
from tests.unit.gateway.local_app import served

T0 = 1_796_000_000.0  # a wall-clock time (seconds since the epoch)

FINISHED = st.lists(
    st.tuples(
        st.sampled_from(["app-1", "app-2", "batch.x@y"]),
        st.sampled_from(["chat", "coder"]),
        st.sampled_from([None, "chat/0", "chat/1"]),  # the replica (None: none answered)
        st.sampled_from(["ok", "refused", "cancelled", "failed", "unavailable"]),
        st.one_of(
            st.none(),
            st.tuples(st.integers(0, 10**5), st.integers(0, 10**5), st.integers(0, 10**5)),
        ),
        st.booleans(),  # estimated
        st.floats(0, 600),  # seconds after T0
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(FINISHED, st.integers(1, 4))
def test_every_flush_is_accepted_and_sums_to_what_was_recorded(
    finished: list[tuple[Any, ...]], flushes: int
) -> None:
    ledger = Ledger()
    want: Counter[tuple[str, str, str]] = Counter()
    rows: list[dict[str, Any]] = []
    for i, (client, model, replica, outcome, tokens, estimated, after) in enumerate(finished):
        served = None if replica is None else model
        ledger.record(
            client, model, served, replica, outcome,
            tokens=tokens, estimated=estimated, now=T0 + after,
        )  # fmt: skip
        want[client, model, "requests"] += 1
        if tokens is not None:
            prompt, cached, completion = tokens
            want[client, model, "prompt_tokens"] += prompt
            want[client, model, "cached_tokens"] += min(cached, prompt)
            want[client, model, "completion_tokens"] += completion
        if i % flushes == 0:  # flushes at any point, several a minute
            rows += ledger.take()
    rows += ledger.take()
    assert not len(ledger) and ledger.take() == []
    got: Counter[tuple[str, str, str]] = Counter()
    for row in rows:
        read = check_usage(json.loads(json.dumps({**row, "gateways": ["gw-1-w0"], "flushes": 1})))
        for field in ("requests", "prompt_tokens", "cached_tokens", "completion_tokens"):
            got[read.client, read.model, field] += getattr(read, field)
        assert read.minute.timestamp() % 60 == 0
    assert +got == +want


def test_requests_are_counted_per_minute_and_held_to_a_bound() -> None:
    ledger = Ledger(max_keys=2)
    for at in (0.0, 59.9, 60.0):
        ledger.record("app-1", "chat", "chat", "chat/0", "ok", tokens=(5, 0, 1), estimated=False,
                      now=1_796_000_040.0 + at)  # fmt: skip
    ledger.record("app-2", "chat", None, None, "refused", tokens=None, estimated=False, now=T0)
    assert ledger.dropped == 1  # a third key: over the bound, counted as dropped
    rows = ledger.take()
    assert [(r["minute"], r["requests"]) for r in rows] == [
        ("2026-11-30T00:54:00Z", 2),
        ("2026-11-30T00:55:00Z", 1),
    ]
    assert ledger.dropped == 0


class _ControlPlane:
    """A real HTTP server answering ``POST /v1/usage`` as told, keeping what it took."""

    def __init__(self, answers: list[int]) -> None:
        self.answers = answers
        self.bodies: list[dict[str, Any]] = []
        self.recorded: dict[str, list[dict[str, Any]]] = {}

    async def post(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        status = self.answers.pop(0) if self.answers else 202
        if status < 300:
            self.recorded.setdefault(body["flush"], body["rows"])
        return web.json_response({"status": status}, status=status)


async def _with_server(plane: _ControlPlane, run: Any) -> None:
    app = web.Application()
    app.router.add_post("/v1/usage", plane.post)
    async with served(app) as url:
        ledger = Ledger()
        flusher = Flusher(ledger, url, "tok", 1.0, worker=0, gateway_id="g")
        try:
            await run(ledger, flusher)
        finally:
            await flusher.close()


def _one(ledger: Ledger, client: str, completion: int) -> None:
    ledger.record(client, "chat", "chat", "chat/0", "ok", tokens=(10, 0, completion),
                  estimated=False, now=T0)  # fmt: skip


def test_a_failed_flush_is_sent_again_with_its_id_and_nothing_counted_is_lost() -> None:
    plane = _ControlPlane([503, 503])

    async def run(ledger: Ledger, flusher: Flusher) -> None:
        _one(ledger, "app-1", 3)
        assert not await flusher.flush_once()
        _one(ledger, "app-1", 4)  # counted while the first is outstanding
        assert not await flusher.flush_once()
        assert await flusher.flush_once()
        # One flush a tick: what was counted meanwhile goes at the next.
        assert len(ledger) == 1 and len(plane.bodies) == 3
        assert await flusher.flush_once()
        assert not len(ledger) and not flusher.pending

    asyncio.run(_with_server(plane, run))
    ids = [b["flush"] for b in plane.bodies]
    # The first flush three times with one id (recorded once), then what came meanwhile.
    assert ids[0] == ids[1] == ids[2] != ids[3] and len(ids) == 4
    total = sum(r["completion_tokens"] for rows in plane.recorded.values() for r in rows)
    assert total == 7
    assert plane.bodies[0]["worker"] == 0 and "gateway" not in plane.bodies[0]


def test_a_refused_flush_is_dropped_and_a_stop_delivers_the_rest() -> None:
    plane = _ControlPlane([422])

    async def run(ledger: Ledger, flusher: Flusher) -> None:
        _one(ledger, "app-1", 3)
        assert await flusher.flush_once()  # refused for good: not sent again
        _one(ledger, "app-2", 5)
        await flusher.final()
        assert not flusher.pending and not len(ledger)

    asyncio.run(_with_server(plane, run))
    assert len(plane.bodies) == 2
    assert [r["client"] for rows in plane.recorded.values() for r in rows] == ["app-2"]


def test_a_usage_event_on_the_stream_is_no_catalog_change_for_the_follower() -> None:
    """Every flush of every gateway is an event of the log: a gateway that read the
    catalog and placements again for each would do so every second per gateway."""
    from gateway.follower import _is_token_event, _is_usage_event

    usage = b' {"position":9,"type":"usage.recorded","model":"","payload":{"client":"a"}}'
    added = b' {"position":8,"type":"model.added","model":"usage.recorded","payload":{}}'
    assert _is_usage_event(usage) and not _is_token_event(usage)
    assert not _is_usage_event(added)
    assert not _is_usage_event(b' {"type": "usage.recorded"')  # not JSON: a change, to be safe
