"""The usage ledger over HTTP: gateways' flushes in (``POST /v1/usage``), the totals out
(``GET /v1/usage``).

A gateway posts what it counted since its last flush (gateway.ledger), at most every
second. The body is received with the API's size cap and checked whole in a worker
thread (each row as replay reads a ``usage.recorded`` payload: events.core.usage);
nothing is stored unless all of it is valid. The rows are stored pending, under the
flush's id (events.write.usage): durable when the answer is sent, and a flush sent again
is recorded once. The serve's roll-up (llmgw.api.runtime.usage_rollup) sums the closed
minutes' rows into ``usage.recorded`` events. Who posted is the token's name and
worker, never the body's.

``GET /v1/usage`` sums the log's usage events and the pending rows (events.read.ledger)
for operator and
reader tokens, with the CLI's filters (``client``, ``model``, ``since``, ``by``); at
most ``MAX_GROUPS`` groups and ``MAX_EVENTS`` events read (``truncated`` says when more
were left out).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import structlog
from anyio import to_thread
from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from autoscale.signals import MAX_WORKERS, identity
from events.core.upcast import UnreadableEvent
from events.core.usage import (
    CLIENT,
    FLUSH,
    GATEWAY,
    MAX_COUNT,
    MAX_NAME,
    MAX_OUTCOMES,
    OUTCOME,
    check_usage,
)
from events.read.ledger import BY, MAX_GROUPS, LedgerQuery, summarise
from events.storage.history import usage_events
from events.storage.usage_pending import pending_rows
from events.write.usage import record_usage
from llmgw.api.guards.bodies import parse_gateway_post, receive
from llmgw.api.guards.tokens import Role
from llmgw.api.rendering.problems import ApiJSON, Problem, errors
from llmgw.api.rendering.schemas import printable_schema
from llmgw.api.routes.access import SECURED, Caller, Reader, Signaller
from llmgw.api.runtime.services import Services

log = structlog.get_logger("llmgw.api")
router = APIRouter()

# Usage events one answer reads at most (a day of one busy pair of client and model on
# ten gateways is 864,000); past them the answer is ``truncated`` at ``position``: ask
# again with a later ``since``.
MAX_EVENTS = 1_000_000
# Rows a flush holds at most (gateway.ledger posts larger ones in parts).
MAX_ROWS = 1_000
_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_COUNT}
_NAME = printable_schema(MAX_NAME) | {"minLength": 1}
_ROW: dict[str, Any] = {
    "type": "object",
    "description": "One (client, model asked, model served, replica, minute)'s counts: "
    "`minute` a whole minute in UTC, `served` and `replica` both given or both null, "
    "`outcomes` adding up to `requests`, `cached_tokens` at most `prompt_tokens` (it is "
    "part of them) and `estimated` at most `requests` (otherwise 422 naming the field). "
    "Names and counts only.",
    "required": ["minute", "client", "model", "requests", "outcomes"],
    "additionalProperties": False,
    "properties": {
        "minute": {"type": "string", "format": "date-time", "maxLength": 40},
        "client": {"type": "string", "pattern": f"^{CLIENT.pattern}$"},
        "model": _NAME,
        "served": {"anyOf": [_NAME, {"type": "null"}]},
        "replica": {"anyOf": [_NAME, {"type": "null"}]},
        "requests": _COUNT | {"minimum": 1},
        "outcomes": {
            "type": "object",
            "maxProperties": MAX_OUTCOMES,
            "propertyNames": {"pattern": f"^{OUTCOME.pattern}$"},
            "additionalProperties": _COUNT,
        },
        "prompt_tokens": _COUNT,
        "cached_tokens": _COUNT,
        "completion_tokens": _COUNT,
        "estimated": _COUNT,
    },
}
# What a row that leaves them out counts.
_DEFAULTS = {
    "served": None,
    "replica": None,
    "prompt_tokens": 0,
    "cached_tokens": 0,
    "completion_tokens": 0,
    "estimated": 0,
}
_USAGE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["flush", "rows"],
                    "additionalProperties": False,
                    "properties": {
                        "gateway": {
                            "type": "string",
                            "pattern": f"^{GATEWAY.pattern}$",
                            "description": "The gateway's own id (its --id), a label for "
                            "the log: who posted is the token's name and `worker`",
                        },
                        "worker": {"type": "integer", "minimum": 0, "maximum": MAX_WORKERS - 1},
                        "flush": {
                            "type": "string",
                            "pattern": f"^{FLUSH.pattern}$",
                            "description": "The flush's id: the same flush sent again is "
                            "recorded once",
                        },
                        "rows": {"type": "array", "maxItems": MAX_ROWS, "items": _ROW},
                    },
                }
            }
        },
    }
}


@router.post(
    "/v1/usage",
    status_code=202,
    responses=errors(401, 403, 413, 422, 503),
    openapi_extra={**_USAGE_BODY, **SECURED},
    tags=["usage"],
    summary="A gateway's usage counts since its last flush, into the ledger (pending "
    "until their minute is rolled up into the log)",
)
async def post_usage(request: Request, call: Signaller) -> Response:
    svc = call.svc
    body = await receive(request, svc.settings.max_body_bytes)
    recorded = await to_thread.run_sync(_parse_and_record, svc, body, call.who.name)
    return ApiJSON(recorded, status_code=202)


def _refused(detail: str) -> Problem:
    return Problem(422, "invalid-usage", f"nothing recorded: {detail}")


def _parse_and_record(svc: Services, body: bytes, token: str) -> dict[str, Any]:
    data = parse_gateway_post(
        body, svc.settings.max_body_bytes, "invalid-usage", prefix="nothing recorded: "
    )
    if not isinstance(data, dict):
        raise _refused("request body: not a JSON object")
    extra = sorted(set(data) - {"gateway", "worker", "flush", "rows"})
    if extra:
        raise _refused(f"unknown fields {extra[:5]}")
    label = data.get("gateway")
    if label is not None and (not isinstance(label, str) or not GATEWAY.fullmatch(label)):
        raise _refused(f"gateway: a name (pattern {GATEWAY.pattern})")
    flush = data.get("flush")
    if not isinstance(flush, str) or not FLUSH.fullmatch(flush):
        raise _refused(f"flush: the flush's id (pattern {FLUSH.pattern})")
    worker = data.get("worker", 0)
    if type(worker) is not int or not 0 <= worker < MAX_WORKERS:
        raise _refused(f"worker: a whole number from 0 to {MAX_WORKERS - 1}")
    rows_in = data.get("rows")
    if not isinstance(rows_in, list) or len(rows_in) > MAX_ROWS:
        raise _refused(f"rows: a list of at most {MAX_ROWS} rows")
    poster = identity(token, worker)
    rows = []
    for index, row in enumerate(rows_in):
        if not isinstance(row, dict) or any(
            k in row for k in ("gateway", "flush", "gateways", "flushes")
        ):
            raise _refused(
                f"rows[{index}]: an object without gateway or flush (nor gateways, flushes)"
            )
        try:
            rows.append(check_usage({**_DEFAULTS, **row, "gateways": [poster], "flushes": 1}))
        except UnreadableEvent as exc:
            raise _refused(f"rows[{index}]: {exc}") from None
    if not rows:
        return {"gateway": poster, "flush": flush, "rows": 0, "already_recorded": False}
    with svc.writing:
        stored = record_usage(svc.engine, poster, flush, rows)
    if not stored:
        svc.metrics.commands_repeated.inc()
    log.info(
        "api.usage_recorded",
        gateway=poster,
        label=label,
        flush=flush,
        rows=len(rows),
        requests=sum(r.requests for r in rows),
        already_recorded=not stored,
    )
    return {
        "gateway": poster,
        "flush": flush,
        "rows": len(rows),
        "already_recorded": not stored,
    }


def _since(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise Problem(
            422,
            "invalid-request",
            f"since {text[:64]!r} is not a time: an ISO-8601 time such as "
            "2026-12-01T00:00:00Z (UTC without a zone)",
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


async def _usage_reader(call: Reader) -> Caller:
    if call.who.role not in (Role.OPERATOR, Role.READER):
        raise Problem(
            403,
            "forbidden",
            f"token {call.who.name!r} has the {call.who.role.value} role; the usage ledger "
            "is read with an operator or reader token",
        )
    return call


@router.get(
    "/v1/usage",
    responses=errors(401, 403, 422),
    openapi_extra=SECURED,
    tags=["usage"],
    summary="The usage ledger: tokens and requests per client and model (or per client, "
    "model or day), summed from the log's usage events and the flushed rows not yet "
    "rolled up into events",
)
async def get_usage(
    call: Reader,
    client: Annotated[
        str | None, Query(max_length=64, description="only this client token")
    ] = None,
    model: Annotated[
        str | None, Query(max_length=255, description="only this model (as asked)")
    ] = None,
    since: Annotated[
        str | None,
        Query(max_length=64, description="only minutes from this time's on (ISO 8601)"),
    ] = None,
    by: Annotated[
        str | None, Query(pattern="^(client|model|day)$", description=f"group by {'|'.join(BY)}")
    ] = None,
) -> Response:
    await _usage_reader(call)
    query = LedgerQuery(client=client, model=model, since=_since(since), by=by)
    ledger = await to_thread.run_sync(_read, call.svc, query)
    return ApiJSON(ledger)


def _read(svc: Services, query: LedgerQuery) -> dict[str, Any]:
    ledger = summarise(
        usage_events(svc.engine, query.since),
        query,
        MAX_GROUPS,
        MAX_EVENTS,
        pending=pending_rows(svc.engine, query.since),
    )
    if ledger.skipped:
        first = ledger.skipped[0]
        log.warning(
            "api.usage_rows_skipped",
            count=ledger.skipped_count,
            position=first.position,
            event_id=first.event_id,
            reason=first.reason,
        )
    return {
        "client": query.client,
        "model": query.model,
        "since": None if query.since is None else query.since.isoformat(),
        **ledger.to_json(),
    }
