"""The catalog's log, read by position: a page at a time, or followed as server-sent events.

Positions are gapless and commit-ordered (see events.store), so a follower
that resumes after the last position it saw neither misses nor repeats an
event. The stream gives each event's position as its SSE ``id``; a client that
reconnects sends it back as ``Last-Event-ID`` (browsers do this themselves),
or passes ``?after=``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

import anyio
import structlog
from anyio import to_thread
from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import OperationalError
from starlette.responses import Response

from events.types import StoredEvent
from llmgw.api import schemas
from llmgw.api.access import SECURED, Reader
from llmgw.api.problems import ApiJSON, Problem, errors, json_text
from llmgw.api.services import Services
from llmgw.views import event_json

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
) -> Response:
    # Positions are gapless: the next ``limit`` events are exactly those up to after + limit.
    events = list(call.svc.store.read(after=after, until=after + limit))
    head = call.svc.store.head()
    return ApiJSON(
        {
            "events": [event_json(e) for e in events],
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
            "`data:` the event as in /v1/events",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **errors(401, 422, 503),
    },
    openapi_extra=SECURED,
    tags=["events"],
    summary="Follow the log (server-sent events); resumes after Last-Event-ID or ?after=",
)
async def stream_events(
    call: Reader,
    after: After = 0,
    last_event_id: Annotated[
        str | None,
        Header(alias="Last-Event-ID", description="the last position received; wins over after"),
    ] = None,
) -> Response:
    start = after
    if last_event_id is not None and last_event_id.strip():
        text = last_event_id.strip()
        if not text.isdigit() or int(text) > MAX_POSITION:
            raise Problem(
                422, "invalid-request", f"Last-Event-ID {text[:40]!r} is not a log position"
            )
        start = int(text)
    await to_thread.run_sync(call.svc.store.head)  # an outage is a 503 now, not a broken stream
    return StreamingResponse(
        _follow(call.svc, start),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _follow(svc: Services, after: int) -> AsyncIterator[str]:
    last = after
    yield f"retry: {RETRY_MS}\n\n"
    idle = 0.0
    poll = svc.settings.stream_poll_s
    while not svc.stopping.is_set():
        try:
            batch = await to_thread.run_sync(_read, svc, last)
        except OperationalError as exc:
            # End the stream; the client reconnects with Last-Event-ID and loses nothing.
            log.warning("api.stream_failed", after=last, error=str(exc.orig or exc).strip())
            return
        if batch:
            yield "".join(_message(e) for e in batch)
            last = batch[-1].position
            idle = 0.0
            continue
        await anyio.sleep(poll)
        idle += poll
        if idle >= svc.settings.keepalive_s:
            yield ": keep-alive\n\n"
            idle = 0.0


def _read(svc: Services, after: int) -> list[StoredEvent]:
    return list(svc.store.read(after=after, until=after + STREAM_BATCH))


def _message(event: StoredEvent) -> str:
    return f"id: {event.position}\ndata: {json_text(event_json(event))}\n\n"
