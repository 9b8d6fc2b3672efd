"""What a gateway reads that no other route serves: the tokens' hashes it verifies.

A gateway verifies tokens itself (the request path never waits on the control plane):
client tokens on its OpenAI routes, and operator and reader tokens on its ``/metrics``
and ``/routing`` (which show replica endpoints and routing internals: the same tokens
this server asks for its own ``/metrics``). So it reads their names, roles, models and
SHA-256, never a token itself (the control plane holds none; a SHA-256 of 256 random
bits gives nothing to guess from). Read with a gateway token. The lists are the auth
file's tokens (read at the server's start) and the database's (``llmgw token new|revoke``),
read afresh for each answer: a gateway asks when the event stream brings a
``token.issued`` or ``token.revoked`` event (gateway.follower), and must not be answered
from a book this server has not refreshed yet.
"""

from __future__ import annotations

from typing import Any

import structlog
from anyio import to_thread
from fastapi import APIRouter, Request
from sqlalchemy.exc import SQLAlchemyError
from starlette.responses import Response

from catalog.forms.allowance import (
    MAX_AMOUNT,
    MAX_DRAWS,
    MAX_GATEWAY,
    MAX_KIND,
    MAX_NAME,
    AllowanceError,
    kinds,
    parse_draws,
)
from events.write.allowances import Asked, exchange
from llmgw.api.guards.bodies import parse_gateway_post, receive
from llmgw.api.rendering.problems import ApiJSON, Problem, errors
from llmgw.api.rendering.schemas import printable_schema
from llmgw.api.routes.access import SECURED, Caller, Gateway
from llmgw.api.runtime.services import Services

log = structlog.get_logger("llmgw.api")

router = APIRouter()


async def _fresh(call: Caller) -> None:
    try:
        await to_thread.run_sync(call.svc.tokens.refresh)
    except SQLAlchemyError as exc:
        # The book this server holds still answers; the gateway asks again on its resync.
        log.warning("api.tokens_refresh_failed", error=str(getattr(exc, "orig", exc))[:300])


@router.get(
    "/v1/gateway/client-tokens",
    responses=errors(401, 403),
    openapi_extra=SECURED,
    tags=["gateway"],
    summary="The client tokens' names, models, limits, priority classes, shares and SHA-256 "
    "(for `llmgw gateway`)",
)
async def client_tokens(call: Gateway) -> Response:
    await _fresh(call)
    return ApiJSON(
        [
            {
                "name": e.name,
                "sha256": e.sha256,
                "models": list(e.models),
                "limits": e.limits.to_json(),
                "priority_class": e.priority_class,
                "share": e.share,
            }
            for e in call.svc.book.clients()
        ]
    )


@router.get(
    "/v1/gateway/reader-tokens",
    responses=errors(401, 403),
    openapi_extra=SECURED,
    tags=["gateway"],
    summary="The operator and reader tokens' names, roles and SHA-256 (for `llmgw gateway`)",
)
async def reader_tokens(call: Gateway) -> Response:
    await _fresh(call)
    return ApiJSON(
        [
            {"name": e.name, "role": e.role.value, "sha256": e.sha256}
            for e in call.svc.book.readers()
        ]
    )


_DRAW = {
    "type": "object",
    "required": ["client", "kind"],
    "additionalProperties": False,
    "properties": {
        "client": printable_schema(MAX_NAME) | {"minLength": 1},
        "kind": printable_schema(MAX_KIND)
        | {"minLength": 1, "description": "requests, tokens, tokens:MODEL or budget"},
        "want": {"type": "integer", "minimum": 0, "maximum": MAX_AMOUNT},
        "give_back": {"type": "integer", "minimum": 0, "maximum": MAX_AMOUNT},
        "credit": {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_AMOUNT,
            "description": "the line of the account's credit asked for or renewed "
            "(0: none, or the one held is returned)",
        },
        "reserve": {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_AMOUNT,
            "description": "the largest reservation of the gateway's requests (the "
            "account's credit pool grows to it)",
        },
    },
}
_ALLOWANCES_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["draws"],
                    "additionalProperties": False,
                    "properties": {
                        "gateway": printable_schema(MAX_GATEWAY)
                        | {"minLength": 1, "description": "the calling gateway's id"},
                        "draws": {"type": "array", "maxItems": MAX_DRAWS, "items": _DRAW},
                    },
                }
            }
        },
    }
}


@router.post(
    "/v1/gateway/allowances",
    responses=errors(401, 403, 413, 422, 503),
    openapi_extra={**_ALLOWANCES_BODY, **SECURED},
    tags=["gateway"],
    summary="Draw chunks of client tokens' allowances and give back what was not used "
    "(for `llmgw gateway`)",
)
async def allowances(request: Request, call: Gateway) -> Response:
    """A gateway's chunks of its limited clients' allowances: for each draw, what it
    gives back is returned to the client's shared account first, then up to ``want``
    is granted from it, in one transaction (events.write.allowances). A client or
    limit the control plane does not know (revoked, changed) is granted nothing, its
    ``size`` null."""
    svc = call.svc
    body = await receive(request, svc.settings.max_body_bytes)
    return ApiJSON(await to_thread.run_sync(_exchange, svc, body))


def _exchange(svc: Services, body: bytes) -> dict[str, Any]:
    data = parse_gateway_post(body, svc.settings.max_body_bytes, "invalid-allowances")
    try:
        draws = parse_draws(data)
    except AllowanceError as exc:
        raise Problem(422, "invalid-allowances", f"nothing granted: {exc}") from None
    limits = {e.name: kinds(e.limits) for e in svc.book.clients()}
    asked = []
    for d in draws:
        size, period = limits.get(d.client, {}).get(d.kind, (None, None))
        asked.append(Asked(d, size, period))
    # (A database that does not answer: 503, the app's handler; the gateway asks again.)
    with svc.writing:
        granted = exchange(svc.engine, asked)
    return {"draws": [g.to_json() for g in granted]}
