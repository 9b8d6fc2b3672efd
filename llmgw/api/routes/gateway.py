"""What a gateway reads that no other route serves: the client tokens' hashes.

A gateway verifies client tokens itself (the request path never waits on the control
plane), so it needs the configured client tokens: their names, their models and
their SHA-256, never a token itself (the control plane holds none). Read with a
gateway token; the list changes when the auth file does, at the server's next start.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from llmgw.api.access import SECURED, Gateway
from llmgw.api.problems import ApiJSON, errors

router = APIRouter()


@router.get(
    "/v1/gateway/client-tokens",
    responses=errors(401, 403),
    openapi_extra=SECURED,
    tags=["gateway"],
    summary="The client tokens' names, models and SHA-256 (for `llmgw gateway`)",
)
async def client_tokens(call: Gateway) -> Response:
    return ApiJSON(
        [
            {"name": e.name, "sha256": e.sha256, "models": list(e.models)}
            for e in call.svc.book.clients()
        ]
    )
