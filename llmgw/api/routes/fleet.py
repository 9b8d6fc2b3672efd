"""What runs and why not: ``GET /v1/fleet`` (per model and node, with each unplaced
replica's reason) and ``GET /v1/diff`` (the catalog between two log positions).

They answer what ``llmgw models``, ``nodes list``, ``place --dry-run`` and ``diff``
answer, in one read each, for the dashboard and for programs. The reasons come from
planning a round now without writing, with the inputs the daemon's next round reads
(``Placer.run``): the server's policy and the placements with their lifecycle (replica
states, cordons, drains, failure back-offs). Planned without the lifecycle, as it
was, a replica kept off a cordoned or backing-off node showed no reason, or one the
daemon would not give. Not the last recorded round's reasons: a round that changes
nothing is not recorded, so they could be any age.

``placement_head`` is the placement log's last position when the fleet was read: a
client that follows the stream from there (``placements_after``) gets what changed
since, not the whole log replayed (the dashboard redrew once per old event).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Query
from starlette.responses import Response

from catalog.diff import diff_catalogs
from events.timetravel import catalogs_at
from llmgw.api import fleet, schemas
from llmgw.api.access import SECURED, Reader
from llmgw.api.problems import ApiJSON, Problem, errors
from llmgw.api.services import Services
from llmgw.views import iso, replica_json
from scheduler.planner.demands import demands
from scheduler.planner.plan import plan as make_plan

router = APIRouter()
MAX_POSITION = 2**62


@router.get(
    "/v1/fleet",
    response_model=schemas.Fleet,
    responses=errors(401, 503),
    openapi_extra=SECURED,
    tags=["nodes"],
    summary="Per model wanted/placed/ready/unplaced (with reasons), per node GPU use",
)
async def get_fleet(call: Reader) -> Response:
    return ApiJSON(await to_thread.run_sync(_fleet, call.svc))


def _fleet(svc: Services) -> dict[str, Any]:
    # The head first: an event recorded while the rest is read is then sent again by the
    # stream (one more redraw), never missed.
    placement_head = svc.nodes.events_head()
    view = svc.gate.view()
    inventory = svc.nodes.nodes()
    state = svc.nodes.state()
    replicas = state.replicas()
    placements = list(state.placements)
    now = datetime.now(UTC)
    policy = svc.settings.policy
    plan = make_plan(
        demands(view.catalog), inventory, placements, now, policy, lifecycle=state.lifecycle
    )
    reasons: dict[str, list[dict[str, Any]]] = {}
    for u in plan.unplaced:
        reasons.setdefault(u.model, []).append({"replica": u.replica, "reason": u.reason})
    models = fleet.models(view.catalog, replicas)
    for row in models:
        row["unplaced_reasons"] = reasons.get(row["name"], [])
    rows = [replica_json(p, view.catalog, status) for p, status in replicas]
    return {
        "catalog_position": view.position,
        "placement_head": placement_head,
        "checked_at": iso(now),
        "policy": {
            "stale_after_s": policy.stale_after.total_seconds(),
            "grace_s": policy.grace.total_seconds(),
        },
        "models": models,
        "nodes": fleet.nodes(inventory, placements, now, policy, state.lifecycle.cordons),
        "placements": rows,
    }


Position = Annotated[int, Query(ge=0, le=MAX_POSITION, description="a log position")]


@router.get(
    "/v1/diff",
    responses={
        **errors(401, 422, 503),
        404: {"description": "a position past the log's head: nothing is recorded there yet"},
    },
    openapi_extra=SECURED,
    tags=["catalog"],
    summary="Models added, removed and changed between two log positions (as `llmgw diff`)",
)
async def get_diff(call: Reader, a: Position, b: Position) -> Response:
    return ApiJSON(await to_thread.run_sync(_diff, call.svc, a, b))


def _diff(svc: Services, a: int, b: int) -> dict[str, Any]:
    head = svc.store.head()
    for position in (a, b):
        # A well-formed position the log has not reached: the catalog there does not
        # exist (yet), which is a 404, not an invalid request (the document cannot know
        # the head, so it calls every position up to MAX_POSITION valid).
        if position > head:
            raise Problem(
                404,
                "not-found",
                f"position {position} is past the log's head ({head}): nothing is recorded "
                f"there yet; diff positions 0 to {head}",
            )
    before, after = catalogs_at(svc.store, svc.declared, [a, b], config_path=svc.config_label)
    return {"from": a, "to": b, **diff_catalogs(before, after).to_json()}
