"""What runs and why not: ``GET /v1/fleet`` (per model and node, with each unplaced
replica's reason) and ``GET /v1/diff`` (the catalog between two log positions).

They answer what ``llmgw models``, ``nodes list``, ``place --dry-run`` and ``diff``
answer, in one read each, for the dashboard and for programs. The reasons come from
planning a round now with the server's policy, without writing (as ``place
--dry-run``), so they are the reasons the next round would give.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Query
from starlette.responses import Response

from catalog.diff import diff_catalogs
from events.timetravel import catalogs_at
from llmgw.api import fleet
from llmgw.api.access import SECURED, Reader
from llmgw.api.problems import ApiJSON, Problem, errors
from llmgw.api.services import Services
from llmgw.views import iso, replica_json
from scheduler.demands import demands
from scheduler.planner import plan as make_plan

router = APIRouter()
MAX_POSITION = 2**62


@router.get(
    "/v1/fleet",
    responses=errors(401, 503),
    openapi_extra=SECURED,
    tags=["nodes"],
    summary="Per model wanted/placed/ready/unplaced (with reasons), per node GPU use",
)
async def get_fleet(call: Reader) -> Response:
    return ApiJSON(await to_thread.run_sync(_fleet, call.svc))


def _fleet(svc: Services) -> dict[str, Any]:
    view = svc.gate.view()
    inventory = svc.nodes.nodes()
    replicas = svc.nodes.replicas()
    placements = [p for p, _ in replicas]
    cordons, _ = svc.nodes.service()
    now = datetime.now(UTC)
    policy = svc.settings.policy
    plan = make_plan(demands(view.catalog), inventory, placements, now, policy)
    reasons: dict[str, list[dict[str, Any]]] = {}
    for u in plan.unplaced:
        reasons.setdefault(u.model, []).append({"replica": u.replica, "reason": u.reason})
    models = fleet.models(view.catalog, replicas)
    for row in models:
        row["unplaced_reasons"] = reasons.get(row["name"], [])
    rows = [replica_json(p, view.catalog, status) for p, status in replicas]
    return {
        "catalog_position": view.position,
        "checked_at": iso(now),
        "policy": {
            "stale_after_s": policy.stale_after.total_seconds(),
            "grace_s": policy.grace.total_seconds(),
        },
        "models": models,
        "nodes": fleet.nodes(inventory, placements, now, policy, cordons),
        "placements": rows,
    }


Position = Annotated[int, Query(ge=0, le=MAX_POSITION, description="a log position")]


@router.get(
    "/v1/diff",
    responses=errors(401, 422, 503),
    openapi_extra=SECURED,
    tags=["catalog"],
    summary="Models added, removed and changed between two log positions (as `llmgw diff`)",
)
async def get_diff(call: Reader, a: Position, b: Position) -> Response:
    return ApiJSON(await to_thread.run_sync(_diff, call.svc, a, b))


def _diff(svc: Services, a: int, b: int) -> dict[str, Any]:
    head = svc.store.head()
    for position in (a, b):
        if position > head:
            raise Problem(
                422,
                "invalid-request",
                f"position {position} is past the log's head ({head}): nothing is recorded "
                "there yet",
            )
    before, after = catalogs_at(svc.store, svc.declared, [a, b], config_path=svc.config_label)
    return {"from": a, "to": b, **diff_catalogs(before, after).to_json()}
