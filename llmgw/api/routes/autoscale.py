"""Autoscaling over HTTP: gateways' signal windows in (``POST /v1/signals``), the
per-model view out (``GET /v1/autoscale``).

A gateway posts every few seconds, and at once when a request starts waiting for a
model with no ready replica. The body is received with the API's size cap and
parsed and checked in a worker thread (``llmgw.api.guards.bodies``, ``autoscale.signals``),
never on the event loop; nothing is stored unless all of it is valid.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request
from starlette.responses import Response

from autoscale.signals import (
    LIVE_S,
    MAX_COUNT,
    MAX_INFLIGHT,
    MAX_LATENCY_S,
    MAX_REPLICAS,
    MAX_WINDOWS,
    MAX_WORKERS,
    SignalsError,
    identity,
    parse_signals,
)
from autoscale.store import AutoscaleStore
from llmgw.api.guards.bodies import parse_gateway_post, receive
from llmgw.api.rendering.problems import ApiJSON, Problem, errors
from llmgw.api.rendering.schemas import printable_schema
from llmgw.api.routes.access import SECURED, Reader, Signaller
from llmgw.api.runtime.services import Services
from llmgw.autoscale_view import autoscale_rows

router = APIRouter()
# Gateways poll the placements; the measured capacities behind each replica's weight
# change only when someone records a bench, so they are read at most this often.
CAPACITY_MAX_AGE_S = 1.0
_capacities: dict[int, tuple[float, dict[tuple[str, str], float]]] = {}
GATEWAY_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"


def _count() -> dict[str, Any]:
    return {"type": "integer", "minimum": 0, "maximum": MAX_COUNT}


def _latency() -> dict[str, Any]:
    return {"anyOf": [{"type": "number", "minimum": 0, "maximum": MAX_LATENCY_S}, {"type": "null"}]}


_TIME = {"type": "string", "format": "date-time", "maxLength": 40}
_INFLIGHT = {"type": "number", "minimum": 0, "maximum": MAX_INFLIGHT}
_REPLICA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"requests": _count(), "inflight_mean": _INFLIGHT, "inflight_max": _count()},
}
_WINDOW = {
    "type": "object",
    "description": "One model's window: `end` after `start` by at most an hour, and `errors` "
    "at most `requests` (otherwise 422 naming the field).",
    "required": ["model", "start", "end"],
    "additionalProperties": False,
    "properties": {
        "model": printable_schema(255) | {"minLength": 1},
        "start": _TIME,
        "end": _TIME,
        "requests": _count(),
        "errors": _count(),
        "waiting": _count(),
        "inflight_mean": _INFLIGHT,
        "inflight_max": _count(),
        "queue_wait_p99_s": _latency(),
        "ttft_p99_s": _latency(),
        "tpot_p99_s": _latency(),
        "replicas": {
            "type": "object",
            "maxProperties": MAX_REPLICAS,
            "propertyNames": printable_schema(255) | {"minLength": 1},
            "additionalProperties": _REPLICA,
        },
    },
}
_SIGNALS_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["gateway", "windows"],
                    "additionalProperties": False,
                    "properties": {
                        "gateway": {
                            "type": "string",
                            "pattern": GATEWAY_PATTERN,
                            "description": "The gateway's own id (its --id), a label for "
                            "the log: who posted is the token's name and `worker`",
                        },
                        "worker": {
                            "type": "integer",
                            "minimum": 0,
                            "maximum": MAX_WORKERS - 1,
                            "description": "The worker of `llmgw gateway --workers N` "
                            "posting (0 for one); the autoscaler counts each token and "
                            "worker as one gateway",
                        },
                        "windows": {"type": "array", "maxItems": MAX_WINDOWS, "items": _WINDOW},
                    },
                }
            }
        },
    }
}


def measured_capacities(svc: Services) -> dict[tuple[str, str], float]:
    """The capacities ``llmgw bench --record`` measured, per (model, profile), cached briefly."""
    now = time.monotonic()
    found = _capacities.get(id(svc))
    if found is None or now - found[0] > CAPACITY_MAX_AGE_S:
        found = (now, AutoscaleStore(svc.engine).capacities())
        _capacities[id(svc)] = found
    return found[1]


@router.post(
    "/v1/signals",
    status_code=202,
    responses=errors(401, 403, 413, 422, 503),
    openapi_extra={**_SIGNALS_BODY, **SECURED},
    tags=["autoscale"],
    summary="A gateway's load windows per model (the autoscaler's input)",
)
async def post_signals(request: Request, call: Signaller) -> Response:
    svc = call.svc
    body = await receive(request, svc.settings.max_body_bytes)
    recorded = await to_thread.run_sync(_parse_and_record, svc, body, call.who.name)
    return ApiJSON(recorded, status_code=202)


def _parse_and_record(svc: Services, body: bytes, token: str) -> dict[str, Any]:
    data = parse_gateway_post(body, svc.settings.max_body_bytes, "invalid-signals")
    try:
        signals = parse_signals(data)
    except SignalsError as exc:
        raise Problem(422, "invalid-signals", f"nothing recorded: {exc}") from None
    now = datetime.now(UTC)
    # Who posted is the token's, never the body's (autoscale.signals).
    poster = identity(token, signals.worker)
    store = AutoscaleStore(svc.engine)
    with svc.writing:
        store.record_signals(poster, signals.received(now, poster), now)
    # Every gateway that posted lately, this one included: each deals the replicas'
    # slots among them by its place in this list (gateway.stages.slotshare).
    live = store.posters(now - timedelta(seconds=LIVE_S), now)
    return {
        "gateway": poster,
        "label": signals.gateway,
        "windows": len(signals.windows),
        "received_at": now.isoformat(),
        "gateways": live if poster in live else sorted([*live, poster]),
    }


@router.get(
    "/v1/autoscale",
    responses=errors(401, 503),
    openapi_extra=SECURED,
    tags=["autoscale"],
    summary="Per model: replicas placed and ready vs wanted vs scaling.min/max, the last "
    "decision, and the recent load and p99s against the SLO",
)
async def get_autoscale(call: Reader) -> Response:
    return ApiJSON(await to_thread.run_sync(_autoscale, call.svc))


def _autoscale(svc: Services) -> dict[str, Any]:
    view = svc.gate.view()
    policy = svc.settings.autoscale
    now = datetime.now(UTC)
    rows = autoscale_rows(
        view.catalog, svc.nodes.replicas(), AutoscaleStore(svc.engine), policy, now
    )
    return {"checked_at": now.isoformat(), "policy": policy.to_json(), "models": rows}
