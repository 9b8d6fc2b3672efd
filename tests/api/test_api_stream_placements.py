"""Placement events on the event stream, against a real server placing in the background:
only when asked for (``?placements=true``), as named ``placement`` messages whose ids
resume both logs; a client that does not ask sees the catalog's events as before."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

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
            bad = ops.get("/v1/events/stream", headers={"Last-Event-ID": bad_id.encode()})
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
