"""Taking a node out of service: cordon, drain, uncordon (operator role).

The same ``scheduler.daemon.node_service.change_service`` as ``llmgw nodes cordon|drain|
uncordon``, with the token's name as the actor of the event.
"""

from __future__ import annotations

from typing import Annotated, Literal

from anyio import to_thread
from fastapi import APIRouter, Query
from pydantic import BaseModel
from starlette.responses import Response

from llmgw.api.rendering.problems import ApiJSON, Problem, errors
from llmgw.api.routes.access import SECURED, Operator
from llmgw.api.runtime.services import Services
from llmgw.views import service_change_json
from scheduler.daemon.node_service import (
    MAX_REASON,
    NodeNotInInventory,
    NodeServiceError,
    ServiceChange,
    change_service,
)

router = APIRouter()


class ServiceOutcome(BaseModel):
    node: str
    action: Literal["cordon", "drain", "uncordon"]
    # The node's service now: null when in service.
    mode: Literal["cordoned", "draining"] | None
    changed: bool
    replicas_left: int
    detail: str
    previous: dict[str, str] | None


def _change(svc: Services, node: str, action: str, actor: str, reason: str) -> ServiceChange:
    try:
        with svc.writing:
            return change_service(svc.nodes, node, action, actor=actor, reason=reason)
    except NodeNotInInventory as exc:
        raise Problem(404, "not-found", str(exc)) from None
    except NodeServiceError as exc:
        raise Problem(422, "invalid-request", str(exc)) from None


def _route(action: Literal["cordon", "drain", "uncordon"], summary: str) -> None:
    async def handler(
        name: str,
        call: Operator,
        reason: Annotated[str, Query(max_length=MAX_REASON, description="why")] = "",
    ) -> Response:
        change = await to_thread.run_sync(_change, call.svc, name, action, call.who.name, reason)
        return ApiJSON(service_change_json(change))

    router.post(
        f"/v1/nodes/{{name}}/{action}",
        response_model=ServiceOutcome,
        responses=errors(401, 403, 404, 422, 503),
        openapi_extra=SECURED,
        tags=["nodes"],
        summary=summary,
        name=f"{action}_node",
    )(handler)


_route("cordon", "Cordon a node: no new replicas land there")
_route("drain", "Drain a node: replace its replicas elsewhere, surge-first")
_route("uncordon", "Put a cordoned or draining node back in service")
