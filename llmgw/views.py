"""The JSON that users see: what ``llmgw ... --json`` prints and what the API answers.

One function per shape, used by both the CLI and the API, so that the two cannot
drift apart (tests/unit/ops/test_views.py holds the shapes). Storage formats are
not here: ``scheduler.persistence.store`` keeps its own (a recorded round must read back the
same whatever this module shows).

Importing this module is cheap (the command line imports it for ``iso``): what a
shape needs from the database layer or the models is imported where it is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from catalog import Catalog, Model
    from catalog.definition.views import EngineProfile
    from events.core.types import StoredEvent
    from events.write.commands import CommandResult
    from scheduler.daemon.node_service import ReplicaCounts, ServiceChange
    from scheduler.lifecycle.inputs import Cordon
    from scheduler.lifecycle.replica_reports import ReplicaStatus
    from scheduler.lifecycle.staleness import StalenessPolicy
    from scheduler.persistence.record_format import PlacementEvent
    from scheduler.planner.fleet.inventory import Node
    from scheduler.planner.fleet.placements import (
        Move,
        Placement,
        Resilience,
        RolloutProgress,
        Unplaced,
    )


def iso(when: datetime) -> str:
    """A time as every JSON answer gives it: ISO-8601 in UTC, with ``Z``."""
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


# -- the catalog --------------------------------------------------------------------------


def catalog_entry(catalog: Catalog, model: Model) -> dict[str, Any]:
    """A model's full definition and whether it is declared (``llmgw models --json``,
    ``GET /v1/catalog``; both add ``replicas``)."""
    return {**model.to_definition(), "declared": catalog.is_declared(model.name)}


def catalog_json(catalog: Catalog) -> list[dict[str, Any]]:
    """Every model, in the catalog's order (``llmgw show --json``)."""
    return [catalog_entry(catalog, m) for m in catalog.models()]


def catalog_counts(counts: ReplicaCounts) -> dict[str, int]:
    return {"wanted": counts.wanted, "placed": counts.placed, "ready": counts.ready}


def model_entry(
    catalog: Catalog, model: Model, counts: ReplicaCounts, resilience: Resilience | None
) -> dict[str, Any]:
    """A model as ``llmgw models --json`` and ``GET /v1/catalog`` show it: its definition,
    its replicas wanted/placed/ready, and its resilience under the placements now (None
    for a model the scheduler does not place, e.g. one that wants no replica)."""
    return {
        **catalog_entry(catalog, model),
        "replicas": catalog_counts(counts),
        "resilience": None if resilience is None else resilience.to_json(),
    }


def openai_entry(catalog: Catalog, model: Model, created: int = 0) -> dict[str, Any]:
    """One entry of the OpenAI-compatible model list, with what a client sizes prompts by.

    ``created``: when the model was added (0 for a declared model; llmgw.api.rendering.openai)."""
    return {
        "id": model.name,
        "object": "model",
        "created": created,
        "owned_by": "llmgw",
        "aliases": list(model.aliases),
        "context_length": model.context_length,
        "max_output": model.max_output,
        "capabilities": model.capabilities.model_dump(mode="json"),
        "declared": catalog.is_declared(model.name),
    }


def event_json(event: StoredEvent) -> dict[str, Any]:
    from catalog.reading.documents import read_json
    from events.read.replay import STORED_LIMITS

    try:
        payload: Any = read_json(event.payload, "payload", STORED_LIMITS)
    except Exception:  # too deep, not JSON, not text: any row a reader must still see
        payload = event.payload  # replay names it as unreadable; a reader still sees it
    return {
        "position": event.position,
        "event_id": event.event_id,
        "command_id": event.command_id,
        "type": event.type,
        "schema_version": event.schema_version,
        "model": event.model,
        "actor": event.actor,
        "reason": event.reason,
        "recorded_at": iso(event.recorded_at),
        "payload": payload,
    }


def placement_event_json(event: PlacementEvent) -> dict[str, Any]:
    """One event of the scheduler's placement log (placement.placed, node.cordoned, ...),
    as the event stream sends it with ``?placements=true``. ``position`` numbers this
    log, apart from the catalog's; ``actor`` is "" for the scheduler's own decisions."""
    return {
        "position": event.position,
        "round": event.round_id,
        "type": event.type,
        "model": event.model,
        "replica": event.replica,
        "profile": event.profile,
        "nodes": list(event.nodes),
        "reason": event.reason,
        "catalog_position": event.catalog_position,
        "recorded_at": iso(event.recorded_at),
        "actor": event.actor,
    }


def command_json(result: CommandResult) -> dict[str, Any]:
    """What an add or a remove recorded (``llmgw add|remove --json``, ``POST
    /v1/catalog/models``, ``DELETE /v1/catalog/models/{name}``)."""
    return {
        "already_recorded": result.already_recorded,
        "events": [event_json(e) for e in result.events],
        "position": max(result.positions, default=0),
    }


# -- nodes --------------------------------------------------------------------------------


def node_json(
    node: Node,
    now: datetime,
    policy: StalenessPolicy,
    cordon: Cordon | None = None,
    replicas: int = 0,
) -> dict[str, Any]:
    """A node as reported, with its freshness and its service (cordoned, draining)."""
    from scheduler.daemon.node_service import service_label
    from scheduler.lifecycle.staleness import Freshness, freshness

    state = freshness(node.reported_at, now, policy)
    return {
        "name": node.name,
        "gpu_class": node.gpu_class,
        "gpus": node.gpus,
        "gpus_reserved": node.gpus_reserved,
        "memory_gb": node.memory_gb,
        "labels": dict(node.labels),
        "fabric": node.fabric,
        "reported_at": iso(node.reported_at),
        "stale": state is not Freshness.FRESH,
        "state": state.value,
        "service": service_label(cordon, replicas),
        "cordon": None if cordon is None else cordon_json(cordon),
        "replicas": replicas,
    }


def cordon_json(cordon: Cordon) -> dict[str, str]:
    return {
        "mode": cordon.mode,
        "actor": cordon.actor,
        "reason": cordon.reason,
        "since": iso(cordon.since),
    }


_MODE_AFTER = {"cordon": "cordoned", "drain": "draining", "uncordon": None}


def service_change_json(change: ServiceChange) -> dict[str, Any]:
    """A cordon, drain or uncordon: ``nodes cordon --json`` and ``POST .../cordon``."""
    return {
        "node": change.node,
        "action": change.action,
        # After the call the node is in the asked-for mode, whether or not it already was.
        "mode": _MODE_AFTER[change.action],
        "changed": change.changed,
        "replicas_left": change.replicas_left,
        "detail": change.describe(),
        "previous": None if change.before is None else cordon_json(change.before),
    }


# -- placements ---------------------------------------------------------------------------


def placement_json(p: Placement) -> dict[str, Any]:
    """A replica slot as a plan has it (``place --json``, ``add --dry-run --json``)."""
    return {
        "model": p.model,
        "replica": p.replica,
        "profile": p.profile,
        "nodes": list(p.nodes),
        "gpus_per_node": p.gpus_per_node,
        "gpu_class": p.gpu_class,
        "fingerprint": p.fingerprint,
        "version": p.version,
        # Non-empty while the replica is moved, surge-first (scheduler.planner.defrag): why.
        "moving": p.moving,
    }


def move_json(m: Move) -> dict[str, Any]:
    """A move a round started (``place --json``): the replica moved, where to, its copy, why."""
    return {
        "model": m.placement.model,
        "replica": m.placement.replica,
        "from": list(m.placement.nodes),
        "to": m.to,
        "copy": None if m.copy is None else m.copy.replica,
        "reason": m.reason,
    }


def replica_state_json(status: ReplicaStatus) -> dict[str, Any]:
    """A replica's lifecycle as the CLI's and the API's JSON show it."""
    return {
        "state": status.shown_state,
        "state_since": iso(status.since),
        "endpoint": status.endpoint,
        "message": status.message,
    }


def placed_replica_json(p: Placement, status: ReplicaStatus) -> dict[str, Any]:
    """A placed replica and its state (``llmgw placements --json``: a plan's placement plus
    the state keys, which tests/e2e/test_cli_scheduler.py holds it to)."""
    return {**placement_json(p), **replica_state_json(status)}


def replica_json(
    p: Placement,
    catalog: Catalog,
    status: ReplicaStatus,
    engine: EngineProfile | None,
    measured: Mapping[tuple[str, str], float] | None = None,
) -> dict[str, Any]:
    """A placed replica, its state, and what its agent starts: the engine view of its
    profile in the model version it was placed with (``scheduler.persistence.versions``;
    None when that definition cannot be had, e.g. a replica being removed with its model).
    ``GET /v1/placements``, ``GET /v1/fleet``.

    ``weight`` is the router's capacity weight in force, read from the catalog as it is
    now (a weight steers routing only, so it needs no new version): the profile's declared
    ``weight``, else the capacity ``llmgw bench --record`` measured (``measured``), else 1."""
    from autoscale.limits import effective_weight

    model = catalog.resolve(p.model)
    return {
        **placed_replica_json(p, status),
        "engine": None if engine is None else {**asdict(engine), "env": dict(engine.env)},
        "weight": None if model is None else effective_weight(model, p.profile, measured or {}),
        **replica_context_json(p, catalog, status),
    }


def replica_context_json(p: Placement, catalog: Catalog, status: ReplicaStatus) -> dict[str, Any]:
    """What one request may really use on the replica, as its engine said once ready
    (None: not known), and a warning when the catalog's context_length promises more.
    A gateway admits by the smaller of ``effective_context_length`` and the catalog's."""
    from scheduler.lifecycle.context_check import context_warning

    model = catalog.resolve(p.model)
    profile = model.profile(p.profile) if model is not None else None
    warning = None
    if model is not None and profile is not None:
        warning = context_warning(
            model=model.name,
            profile=p.profile,
            engine=profile.engine,
            context_length=model.context_length,
            effective=status.effective_context_length,
            detail=status.context_detail,
        )
    return {
        "effective_context_length": status.effective_context_length,
        "context_detail": status.context_detail,
        "context_warning": warning,
    }


def unplaced_json(u: Unplaced) -> dict[str, Any]:
    return {"model": u.model, "replica": u.replica, "reason": u.reason}


def rollout_json(r: RolloutProgress) -> dict[str, Any]:
    return {
        "model": r.model,
        "cause": r.cause,
        "old": [placement_json(p) for p in r.old],
        "new": [placement_json(p) for p in r.new],
        "waiting": r.waiting,
    }
