"""Placement events on the event stream, against a real server placing in the background:
only when asked for (``?placements=true``), as named ``placement`` messages whose ids
resume both logs; a client that does not ask sees the catalog's events as before."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.api.routes.events import STREAM_BATCH
from tests.api.server import ApiServer, Tokens, definition, running, sse_events, sse_messages

pytestmark = pytest.mark.slow

T4 = {"gpu_class": "T4", "gpus": 4, "memory_gb": 64}


@pytest.fixture
def server(tmp_path: Path, sqlite_url: str, tokens: Tokens) -> Iterator[ApiServer]:
    args = ["--with-scheduler", "--interval", "0.2", "--stream-poll", "0.05"]
    with running(ApiServer(tmp_path, sqlite_url, tokens=tokens, args=args)) as started:
        yield started


def _until_placed(lines: Iterator[str]) -> list[tuple[str, str, dict[str, Any]]]:
    seen: list[tuple[str, str, dict[str, Any]]] = []
    for message in sse_messages(lines):
        seen.append(message)
        if message[0] == "placement" and message[2]["type"] == "placement.placed":
            return seen
    raise AssertionError(f"the stream ended before a placement: {seen}")


def test_placement_events_come_as_named_messages_with_ids_that_resume_both_logs(
    server: ApiServer, tokens: Tokens
) -> None:
    timeout = httpx.Timeout(30, read=30)
    with server.client(tokens.operator, timeout=timeout) as ops:
        assert ops.put("/v1/nodes/node-0", json=T4).status_code == 200
        model = definition("placed-model", scaling={"min": 1}, fallbacks=["base"])
        assert ops.post("/v1/catalog/models", json=model).status_code == 201
        with ops.stream("GET", "/v1/events/stream", params={"placements": "true"}) as response:
            assert response.status_code == 200
            seen = _until_placed(response.iter_lines())
        (added,) = [m for m in seen if m[0] == "message"]
        # Catalog events stay unnamed messages, as in /v1/events; the id is both positions.
        assert added[2]["type"] == "model.added" and added[2]["model"] == "placed-model"
        assert added[1] == f"{added[2]['position']}:0"
        name, event_id, placed = seen[-1]
        assert name == "placement"
        assert placed["model"] == "placed-model" and placed["nodes"] == ["node-0"]
        assert placed["actor"] == "" and placed["round"] >= 1
        assert event_id == f"{added[2]['position']}:{placed['position']}"

        # Resuming with the catalog message's id delivers the placement events after it.
        resume = {"Last-Event-ID": added[1]}
        params = {"placements": "true"}
        with ops.stream("GET", "/v1/events/stream", params=params, headers=resume) as response:
            again = _until_placed(response.iter_lines())
        assert [m for m in again if m[0] == "message"] == []
        assert again[-1] == seen[-1]

        # A numeric Last-Event-ID (a client from before) still works: catalog position,
        # placement events from placements_after.
        resume = {"Last-Event-ID": str(added[2]["position"])}
        params = {"placements": "true", "placements_after": str(placed["position"] - 1)}
        with ops.stream("GET", "/v1/events/stream", params=params, headers=resume) as response:
            assert _until_placed(response.iter_lines()) == [seen[-1]]

        for bad_id in ("3:x", "3:", ":3", "3:4:5", "\u00b2"):
            bad = ops.get("/v1/events/stream", headers={b"Last-Event-ID": bad_id.encode()})
            assert bad.status_code == 422, bad_id
            assert "N:M" in bad.json()["detail"]


def test_without_placements_the_stream_is_the_catalogs_alone_as_before(
    server: ApiServer, tokens: Tokens
) -> None:
    with server.client(tokens.operator, timeout=httpx.Timeout(30, read=30)) as ops:
        assert ops.put("/v1/nodes/node-0", json=T4).status_code == 200
        first = definition("placed-model", scaling={"min": 1}, fallbacks=["base"])
        assert ops.post("/v1/catalog/models", json=first).status_code == 201

        def placed() -> bool:
            return any(p["model"] == "placed-model" for p in ops.get("/v1/placements").json())

        while not placed():  # a placement event is recorded by now
            time.sleep(0.1)
        assert ops.post("/v1/catalog/models", json=definition("later")).status_code == 201
        with ops.stream("GET", "/v1/events/stream") as response:
            lines = list(_lines_until(response.iter_lines(), "later"))
        assert not any(line.startswith("event:") for line in lines)
        events = [(p, d["model"]) for p, d in sse_events(lines)]
        assert events == [(1, "placed-model"), (2, "later")]


def _lines_until(lines: Iterator[str], model: str) -> Iterator[str]:
    for line in lines:
        yield line
        if line.startswith("data:") and f'"model":"{model}"' in line.replace(" ", ""):
            yield ""
            return


def test_a_page_made_only_of_unreadable_placement_rows_is_named_and_passed_not_stalled_on(
    tmp_path: Path, db_url: str, tokens: Tokens
) -> None:
    """More unreadable rows in a row than one read takes (500) used to hold the stream:
    each poll read the same page, decoded nothing and stayed where it was, so no later
    placement event ever came. Each is now a named message with an id, and the stream
    goes on past them."""
    from sqlalchemy import insert

    from events.database.connection import make_engine
    from scheduler.persistence.tables import PlacementEventRow, table

    bad = STREAM_BATCH + 1
    row = {
        "round_id": 1,
        "type": "placement.placed",
        "model": "llama",
        "replica": 0,
        "profile": "default",
        "reason": "",
        "catalog_position": 0,
        "recorded_at": datetime.now(UTC),
        "actor": "",
    }
    rows = [{**row, "position": i, "nodes": "{not json"} for i in range(1, bad + 1)]
    rows.append({**row, "position": bad + 1, "nodes": '["node-0"]'})
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(insert(table(PlacementEventRow)), rows)
    engine.dispose()

    args = ["--stream-poll", "0.05"]
    server = ApiServer(tmp_path, db_url, tokens=tokens, args=args, declared=None)
    with running(server), server.client(tokens.reader, timeout=httpx.Timeout(30, read=30)) as c:
        params = {"placements": "true"}
        with c.stream("GET", "/v1/events/stream", params=params) as response:
            seen = _until_placed(response.iter_lines())
        unreadable = [m for m in seen if m[0] == "placement-unreadable"]
        assert [m[2]["position"] for m in unreadable] == list(range(1, bad + 1))
        assert [m[1] for m in unreadable] == [f"0:{i}" for i in range(1, bad + 1)]
        assert "nodes" in unreadable[0][2]["reason"]  # the reason row_skipped gives
        assert seen[-1][2]["position"] == bad + 1 and seen[-1][1] == f"0:{bad + 1}"

        # Resuming from an unreadable row's id goes on after it, not back to it.
        resume = {"Last-Event-ID": f"0:{bad - 1}"}
        with c.stream("GET", "/v1/events/stream", params=params, headers=resume) as response:
            again = _until_placed(response.iter_lines())
        assert [(m[0], m[1]) for m in again] == [
            ("placement-unreadable", f"0:{bad}"),
            ("placement", f"0:{bad + 1}"),
        ]
    assert len(server.logs("scheduler.row_skipped")) >= bad
