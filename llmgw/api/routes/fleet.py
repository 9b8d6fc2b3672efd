"""What runs and why not: ``GET /v1/fleet`` (per model and node, with each unplaced
replica's reason) and ``GET /v1/diff`` (the catalog between two log positions).

They answer what ``llmgw models``, ``nodes list`` and ``diff`` answer, in one read
each, for the dashboard and for programs. The unplaced replicas' reasons are the
scheduler's own: what its last round left unplaced, and why, as the daemon wrote it
(``scheduler.persistence.outcome_store``), with the round's time in ``reasons_from``. They used to
come from planning a round per request, which cost a plan each time the dashboard
redrew, on every API replica. Recorded rounds (``placement_rounds``) could not serve:
only rounds that change placements are recorded, and a round that leaves a new model
unplaced changes none. Before the scheduler's first round there are no reasons
(``reasons_from`` is null); ``llmgw place --dry-run`` plans one on demand.

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

from autoscale.runner import wanted_counts
from autoscale.store import AutoscaleStore
from catalog.changes.diff import diff_catalogs
from events.read.time_travel import catalogs_at
from llmgw.api.rendering import schemas
from llmgw.api.rendering.problems import ApiJSON, Problem, errors
from llmgw.api.routes.access import SECURED, Reader
from llmgw.api.routes.autoscale import measured_capacities
from llmgw.api.runtime import fleet_counts
from llmgw.api.runtime.services import Services
from llmgw.views import iso, replica_json
from scheduler.persistence.outcome_store import Outcome
from scheduler.persistence.row_decoding import Unreadable
from scheduler.planner.demands import demands
from scheduler.planner.resilience import resilience

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
    return ApiJSON(call.shown(await to_thread.run_sync(_fleet, call.svc)))


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
    counts = wanted_counts(AutoscaleStore(svc.engine), svc.settings.autoscale)
    asked = demands(view.catalog, counts)
    # The unplaced replicas and their reasons as the last round recorded them: a read
    # of the fleet plans nothing.
    outcome = svc.nodes.outcome()
    reasons: dict[str, list[dict[str, Any]]] = {}
    if isinstance(outcome, Outcome):
        for u in outcome.unplaced:
            reasons.setdefault(u.model, []).append({"replica": u.replica, "reason": u.reason})
    models = fleet_counts.models(view.catalog, replicas)
    # What placement is asked for: scaling.min, or the autoscaler's count within min..max.
    replicas_asked = {d.model: d.replicas for d in asked}
    by_name = {n.name: n for n in inventory}
    figures = {r.model: r for r in resilience(asked, placements, by_name)}
    for row in models:
        row["wanted"] = replicas_asked.get(row["name"], row["wanted"])
        row["unplaced"] = max(row["wanted"] - row["placed"], 0)
        row["unplaced_reasons"] = reasons.get(row["name"], []) if row["unplaced"] else []
        figure = figures.get(row["name"])
        row["resilience"] = None if figure is None else figure.to_json()
    measured = measured_capacities(svc)
    book = svc.nodes.versions
    rows = [
        replica_json(p, view.catalog, status, book.engine_view(p, view.catalog), measured)
        for p, status in replicas
    ]
    return {
        "catalog_position": view.position,
        "placement_head": placement_head,
        "checked_at": iso(now),
        "policy": {
            "stale_after_s": policy.stale_after.total_seconds(),
            "grace_s": policy.grace.total_seconds(),
        },
        "reasons_from": _reasons_from(outcome),
        "models": models,
        "nodes": fleet_counts.nodes(inventory, placements, now, policy, state.lifecycle.cordons),
        "placements": rows,
        # The declared file as this server last read it (a refused edit: where and why).
        "declared": svc.declared_watch.to_json(),
    }


def _reasons_from(outcome: Outcome | Unreadable | None) -> dict[str, Any] | None:
    if outcome is None:
        return None
    if isinstance(outcome, Unreadable):
        return {
            "planned_at": None,
            "catalog_position": None,
            "recorded_round": None,
            "unreadable": outcome.reason,
        }
    return {
        "planned_at": iso(outcome.planned_at),
        "catalog_position": outcome.catalog_position,
        "recorded_round": outcome.round_id,
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
    return ApiJSON(call.shown(await to_thread.run_sync(_diff, call.svc, a, b)))


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
    before, after = catalogs_at(svc.store, svc.gate.declared, [a, b], config_path=svc.config_label)
    return {"from": a, "to": b, **diff_catalogs(before, after).to_json()}
