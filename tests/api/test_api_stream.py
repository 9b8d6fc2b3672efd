"""Following the log over server-sent events: every event exactly once, in order, while
several writers append and while the follower keeps reconnecting."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.server import ApiServer, Tokens, definition, running, sse_events

pytestmark = pytest.mark.slow

WRITERS = 3
ADDS = 12  # per writer
RECONNECT_EVERY = 5  # events


def follow(server: ApiServer, token: str, until: int, seen: list[tuple[int, Any]]) -> int:
    """Follow until position ``until``, hanging up every few events and resuming, alternately
    with ?after= and with Last-Event-ID; returns how many connections it took."""
    connections = 0
    # Bounds that only catch a hang: a busy 2-core CI machine can take seconds per event.
    deadline = time.monotonic() + 180
    with server.client(token, timeout=httpx.Timeout(60, read=60)) as client:
        while (seen[-1][0] if seen else 0) < until and time.monotonic() < deadline:
            last = seen[-1][0] if seen else 0
            connections += 1
            if connections % 2:
                params, headers = {"after": last}, {}
            else:
                # A browser's EventSource reconnects to the same URL, sending Last-Event-ID.
                params, headers = {"after": 0}, {"Last-Event-ID": str(last)}
            with client.stream(
                "GET", "/v1/events/stream", params=params, headers=headers
            ) as response:
                assert response.status_code == 200, response.read()
                assert response.headers["content-type"].startswith("text/event-stream")
                for count, event in enumerate(sse_events(response.iter_lines()), start=1):
                    seen.append(event)
                    if count == RECONNECT_EVERY or event[0] >= until:
                        break
    return connections


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_follower_sees_every_event_once_in_order_across_writers_and_reconnects(
    backend: str, tmp_path: Path, tokens: Tokens, request: pytest.FixtureRequest
) -> None:
    db_url = str(request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url"))
    server = ApiServer(tmp_path, db_url, tokens=tokens, args=["--stream-poll", "0.05"])
    with running(server):
        total = WRITERS * ADDS
        seen: list[tuple[int, Any]] = []
        failures: list[str] = []

        def writer(w: int) -> None:
            with server.client(tokens.operator) as client:
                for i in range(ADDS):
                    response = client.post("/v1/catalog/models", json=definition(f"s{w}-{i}"))
                    if response.status_code != 201:
                        failures.append(response.text)

        errors: list[BaseException] = []

        def following() -> None:
            try:
                follow(server, tokens.reader, total, seen)
            except BaseException as exc:
                errors.append(exc)

        follower = threading.Thread(target=following)
        follower.start()
        writers = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
        for t in writers:
            t.start()
        for t in writers:
            t.join()
        follower.join(timeout=60)
        assert not follower.is_alive()
        assert errors == [] and failures == []

        ids = [position for position, _ in seen]
        assert ids == list(range(1, total + 1)), "each event once, in log order, none missed"
        assert all(data["position"] == position for position, data in seen)
        with server.client(tokens.reader) as reader:
            logged = reader.get("/v1/events", params={"limit": 1000}).json()["events"]
        assert [data for _, data in seen] == logged
        assert sorted(e["model"] for e in logged) == sorted(
            f"s{w}-{i}" for w in range(WRITERS) for i in range(ADDS)
        )


def test_the_stream_resumes_after_last_event_id_and_ends_when_the_server_stops(
    tmp_path: Path, sqlite_url: str, tokens: Tokens
) -> None:
    server = ApiServer(tmp_path, sqlite_url, tokens=tokens, args=["--stream-poll", "0.05"])
    with running(server), server.client(tokens.operator) as ops:
        for i in range(3):
            assert ops.post("/v1/catalog/models", json=definition(f"r-{i}")).status_code == 201
        headers = {"Last-Event-ID": "2"}
        with ops.stream("GET", "/v1/events/stream", params={"after": 0}, headers=headers) as r:
            lines = r.iter_lines()
            assert next(lines) == "retry: 1000", "clients are told how soon to reconnect"
            position, data = next(sse_events(lines))
            assert (position, data["model"]) == (3, "r-2")
        # Not a position: letters, a digit int() refuses, and more digits than int() reads
        # from a string (4,300) are each a 422, never a 500.
        for last_id in (b"x", "\u00b2".encode(), b"9" * 5000, b"1:" + b"9" * 5000):
            bad = ops.get("/v1/events/stream", headers={b"Last-Event-ID": last_id})
            assert bad.status_code == 422, (last_id[:20], bad.status_code)
            assert bad.json()["type"] == "urn:llmgw:problem:invalid-request"

        # A follower still connected does not hold up a stop.
        with ops.stream("GET", "/v1/events/stream", params={"after": 3}) as open_stream:
            assert next(open_stream.iter_lines()).startswith("retry:")
            # stop() sends SIGTERM and kills only after its own generous timeout, and
            # then answers None: a clean 0 is the proof, without timing anything.
            assert server.stop() == 0
    assert server.logs("api.stopped")
