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

import structlog
from anyio import to_thread
from fastapi import APIRouter
from sqlalchemy.exc import SQLAlchemyError
from starlette.responses import Response

from llmgw.api.rendering.problems import ApiJSON, errors
from llmgw.api.routes.access import SECURED, Caller, Gateway

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
