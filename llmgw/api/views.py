"""What the API answers with: the JSON shapes of models, events, nodes and placements.

The catalog entries are the CLI's (``llmgw models --json``: the full
definition plus ``declared``) and the node rows are ``llmgw nodes list
--json``'s; tests hold the two side by side.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from catalog import Catalog, Model
from catalog.documents import read_json
from events.replay import STORED_LIMITS
from events.types import StoredEvent
from scheduler import Node, Placement, StalenessPolicy
from scheduler.lifecycle import Cordon
from scheduler.replicas import ReplicaStatus
from scheduler.service import ReplicaCounts, service_label
from scheduler.staleness import Freshness, freshness


def iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def catalog_entry(catalog: Catalog, model: Model) -> dict[str, Any]:
    return {**model.to_definition(), "declared": catalog.is_declared(model.name)}


def openai_entry(catalog: Catalog, model: Model, created: int = 0) -> dict[str, Any]:
    """One entry of the OpenAI-compatible model list, with what a client sizes prompts by.

    ``created``: when the model was added (0 for a declared model; llmgw.api.openai)."""
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


def node_json(
    node: Node,
    now: datetime,
    policy: StalenessPolicy,
    cordon: Cordon | None = None,
    replicas: int = 0,
) -> dict[str, Any]:
    """A node as reported, with its freshness and its service (cordoned, draining)."""
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
        "cordon": None
        if cordon is None
        else {
            "mode": cordon.mode,
            "actor": cordon.actor,
            "reason": cordon.reason,
            "since": iso(cordon.since),
        },
        "replicas": replicas,
    }


def catalog_counts(counts: ReplicaCounts) -> dict[str, int]:
    return {"wanted": counts.wanted, "placed": counts.placed, "ready": counts.ready}


def replica_state_json(status: ReplicaStatus) -> dict[str, Any]:
    """A replica's lifecycle as the CLI's and the API's JSON show it."""
    return {
        "state": status.shown_state,
        "state_since": iso(status.since),
        "endpoint": status.endpoint,
        "message": status.message,
    }


def placement_json(p: Placement, catalog: Catalog, status: ReplicaStatus) -> dict[str, Any]:
    """A replica, its state, and what its agent starts: the engine view of its profile, when
    the model and profile are still in the catalog (a replica being removed may not be)."""
    model = catalog.resolve(p.model)
    engine = model.engine_profile(p.profile) if model is not None else None
    return {
        **p.to_json(),
        **replica_state_json(status),
        "engine": None if engine is None else {**asdict(engine), "env": dict(engine.env)},
    }
