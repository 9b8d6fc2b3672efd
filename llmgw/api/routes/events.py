"""The catalog's log, read by position: a page at a time, or followed as server-sent events.

Positions are gapless and commit-ordered (see events.storage.sql_log), so a follower
that resumes after the last position it saw neither misses nor repeats an
event. The stream gives each event's position as its SSE ``id``; a client that
reconnects sends it back as ``Last-Event-ID`` (browsers do this themselves),
or passes ``?after=``.

The scheduler's placement log (placement.placed, placement.removed, node.cordoned,
...) is on the stream only when asked for, with ``?placements=true``, so that a
client written for catalog events alone sees exactly what it saw before. Its
events come as named SSE messages (``event: placement``), which an EventSource's
``onmessage`` ignores; catalog events stay unnamed. The two logs number their
events apart, so on such a stream every message's ``id`` is both positions,
``CATALOG:PLACEMENTS`` (e.g. ``12:40``): what a reconnecting client sends back
resumes both. A plain numeric Last-Event-ID is still accepted (the catalog's
position; the placement log then resumes after ``placements_after``).

A placement row that cannot be read comes as ``event: placement-unreadable`` (``data:``
its position and the reason ``scheduler.row_skipped`` logs), with an id like any other
message. Not a comment: a comment carries no id, so a client reconnecting after one would
be sent the row again; and the stream must step past such rows, or a page made only of
them would hold the follower in place for good.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from itertools import islice
from typing import Annotated

import structlog
from anyio import to_thread
from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import OperationalError
from starlette.responses import Response

from catalog.secrecy.secrets import redact
from events.core.types import USAGE_RECORDED, StoredEvent
from events.storage.history import HistoryQuery, history
from events.storage.history import newest as newest_events
from llmgw.api.rendering import schemas
from llmgw.api.rendering.problems import ApiJSON, Problem, errors, json_text
from llmgw.api.routes.access import SECURED, Reader
from llmgw.api.runtime.services import Services
from llmgw.views import event_json, placement_event_json
from scheduler.persistence.record_format import PlacementEvent
from scheduler.persistence.row_decoding import Unreadable

log = structlog.get_logger("llmgw.api")

router = APIRouter()

# Positions are BIGINT; keep ``after + limit`` inside it.
MAX_POSITION = 2**62
STREAM_BATCH = 500
# What a client waits before reconnecting after the stream ends (SSE ``retry:``).
RETRY_MS = 1000

After = Annotated[
    int, Query(ge=0, le=MAX_POSITION, description="only events after this log position")
]


@router.get(
    "/v1/events",
    response_model=schemas.EventPage,
    responses=errors(401, 422, 503),
    openapi_extra=SECURED,
    tags=["events"],
    summary="The catalog's events after a position, in log order",
)
def list_events(
    call: Reader,
    after: After = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    usage: Annotated[
        bool,
        Query(
            description="false: leave out the usage ledger's `usage.recorded` events (one a "
            "minute per client, model and replica with traffic), for an audit of the "
            "catalog's changes"
        ),
    ] = True,
    newest: Annotated[
        int | None,
        Query(
            ge=1,
            le=1000,
            description="instead of `after` and `limit`: the newest this many events (of "
            "those `usage` keeps), in log order",
        ),
    ] = None,
) -> Response:
    store = call.svc.store
    kept = HistoryQuery(without_type=None if usage else USAGE_RECORDED)
    if newest is not None:
        events = newest_events(store.engine, kept, newest)
    elif usage:
        # Positions are gapless: the next ``limit`` events are exactly those up to
        # after + limit.
        events = list(store.read(after=after, until=after + limit))
    else:
        events = list(islice(history(store.engine, kept, after), limit))
    head = store.head()
    return ApiJSON(
        {
            "events": call.shown([event_json(e) for e in events]),
            "next_after": events[-1].position if events else after,
            "head": head,
        }
    )


@router.get(
    "/v1/events/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "`text/event-stream`: one SSE message per event, `id:` its position, "
            "`data:` the event as in /v1/events; with `placements=true` also `event: placement` "
            "messages (`data:` a placement event), `event: placement-unreadable` for a stored "
            "placement event that cannot be read (`data:` its `position` and `reason`), and "
            "ids `CATALOG:PLACEMENTS`",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **errors(401, 422, 503),
    },
    openapi_extra=SECURED,
    tags=["events"],
    summary="Follow the log (server-sent events); resumes after Last-Event-ID or ?after=",
    description="Catalog events as unnamed SSE messages, `id:` the log position. With "
    "`placements=true`, also the scheduler's placement events (placement.placed, "
    "placement.removed, node.cordoned, ...) as named messages (`event: placement`, which an "
    "EventSource's `onmessage` ignores: listen with `addEventListener('placement', ...)`), and "
    "every message's `id:` is `CATALOG:PLACEMENTS`, both logs' positions, so that "
    "Last-Event-ID resumes both. A numeric Last-Event-ID is the catalog's position alone.",
)
async def stream_events(
    call: Reader,
    after: After = 0,
    placements: Annotated[
        bool,
        Query(description="also the scheduler's placement events, as `event: placement`"),
    ] = False,
    placements_after: Annotated[
        int,
        Query(
            ge=0,
            le=MAX_POSITION,
            description="with placements: only placement events after this position",
        ),
    ] = 0,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            description="the last id received: a catalog position, or CATALOG:PLACEMENTS; "
            "wins over after and placements_after",
        ),
    ] = None,
) -> Response:
    start, placements_start = after, placements_after
    if last_event_id is not None and last_event_id.strip():
        start, resumed = _resume(last_event_id.strip())
        if resumed is not None:
            placements_start = resumed
    await to_thread.run_sync(call.svc.store.head)  # an outage is a 503 now, not a broken stream
    return StreamingResponse(
        _follow(
            call.svc,
            start,
            placements_start if placements else None,
            redacting=not call.sees_secrets(),
        ),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _resume(text: str) -> tuple[int, int | None]:
    """A Last-Event-ID: ``N`` (a catalog position) or ``N:M`` (and a placement position)."""
    catalog, colon, placed = text.partition(":")
    parts = [catalog, placed] if colon else [catalog]
    # ASCII digits only: str.isdigit() also holds for '²', which int() refuses; and
    # at most 19 of them, so int() never meets a string past its digit limit (4,300).
    if not all(
        p.isascii() and p.isdigit() and len(p) <= 19 and int(p) <= MAX_POSITION for p in parts
    ):
        raise Problem(
            422,
            "invalid-request",
            f"Last-Event-ID {text[:40]!r} is not a log position (N, or N:M with placements)",
        )
    return int(catalog), int(placed) if colon else None


async def _follow(
    svc: Services, after: int, placements_after: int | None, *, redacting: bool = True
) -> AsyncIterator[str]:
    """``placements_after`` None: the catalog's events alone, as before placements were
    on the stream (ids are positions); else both logs, ids ``CATALOG:PLACEMENTS``."""
    last, placed = after, placements_after
    yield f"retry: {RETRY_MS}\n\n"
    poll = svc.settings.stream_poll_s
    quiet_since = time.monotonic()
    while not svc.stopping.is_set():
        # Taken before the read: a write notified while reading wakes the wait below at once.
        seen = svc.changes.generation
        try:
            batch = await to_thread.run_sync(_read, svc, last)
            more = [] if placed is None else await to_thread.run_sync(_read_placed, svc, placed)
        except OperationalError as exc:
            # End the stream; the client reconnects with Last-Event-ID and loses nothing.
            log.warning("api.stream_failed", after=last, error=str(exc.orig or exc).strip())
            return
        if batch or more:
            # Within each log, log order; between the two, catalog events first in a poll
            # (the logs share no order: each message's id says where both stand).
            messages: list[str] = []
            for e in batch:
                last = e.position
                event_id = last if placed is None else f"{last}:{placed}"
                messages.append(_message(e, event_id, redacting=redacting))
            for p in more:
                if isinstance(p, Unreadable):
                    # Named, with an id, and passed: the next poll reads past it, and a
                    # client reconnecting with this id does not read it again.
                    placed = _position(p)
                    messages.append(_unreadable_message(p, f"{last}:{placed}"))
                    continue
                placed = p.position
                messages.append(_placement_message(p, f"{last}:{placed}"))
            yield "".join(messages)
            quiet_since = time.monotonic()
            continue
        # Until the next poll, or sooner when PostgreSQL notifies a write by any process
        # (llmgw.api.runtime.changes); on SQLite, the poll alone.
        await svc.changes.wait(poll, seen)
        if time.monotonic() - quiet_since >= svc.settings.keepalive_s:
            yield ": keep-alive\n\n"
            quiet_since = time.monotonic()


def _read(svc: Services, after: int) -> list[StoredEvent]:
    return list(svc.store.read(after=after, until=after + STREAM_BATCH))


def _read_placed(svc: Services, after: int) -> list[PlacementEvent | Unreadable]:
    return svc.nodes.follow_page(after=after, limit=STREAM_BATCH)


def _position(row: Unreadable) -> int:
    # The position column is the table's integer primary key: it is always a number.
    return int(row.key[0])


def _message(event: StoredEvent, event_id: int | str, *, redacting: bool = True) -> str:
    data = event_json(event)
    return f"id: {event_id}\ndata: {json_text(redact(data) if redacting else data)}\n\n"


def _placement_message(event: PlacementEvent, event_id: str) -> str:
    return f"event: placement\nid: {event_id}\ndata: {json_text(placement_event_json(event))}\n\n"


def _unreadable_message(row: Unreadable, event_id: str) -> str:
    data = {"position": _position(row), "reason": row.reason}
    return f"event: placement-unreadable\nid: {event_id}\ndata: {json_text(data)}\n\n"
