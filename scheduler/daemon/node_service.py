"""Taking nodes out of service and the lifecycle's read models, shared by the CLI and the API.

No rules live here beyond refusing what cannot be right (a node not in the
inventory, a reason that is not text); the planner decides what a cordon or
a drain means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from catalog import Catalog
from catalog.forms.printable import printable
from scheduler.lifecycle.inputs import CORDONED, DRAINING, Cordon
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.persistence.store import SchedulerStore
from scheduler.planner.fleet.placements import Placement

MODES = {"cordon": CORDONED, "drain": DRAINING, "uncordon": None}
MAX_REASON = 2000


class NodeServiceError(ValueError):
    """A cordon, drain or uncordon that cannot be recorded; the message says why."""


class NodeNotInInventory(NodeServiceError):
    """The node named is not in the inventory: a refusal of its own kind (HTTP 404), so
    no caller has to read the message to tell it from an invalid request."""


@dataclass(frozen=True, slots=True)
class ServiceChange:
    node: str
    action: str  # cordon, drain, uncordon
    before: Cordon | None
    changed: bool
    replicas_left: int

    def describe(self) -> str:
        if not self.changed:
            now = "in service" if self.before is None else self.before.mode
            return f"node {self.node} is already {now}; nothing recorded"
        if self.action == "uncordon":
            return f"node {self.node} is back in service: new replicas may land there"
        if self.action == "cordon":
            return (
                f"node {self.node} cordoned: nothing new lands there; its {self.replicas_left} "
                "replica(s) keep running"
            )
        return (
            f"node {self.node} draining: its {self.replicas_left} replica(s) are replaced "
            "elsewhere, each removed once its replacement is ready"
        )


def change_service(
    store: SchedulerStore, node: str, action: str, *, actor: str, reason: str
) -> ServiceChange:
    if action not in MODES:
        raise NodeServiceError(f"unknown action {action!r}; use cordon, drain or uncordon")
    if len(reason) > MAX_REASON or not printable(reason):
        raise NodeServiceError(
            f"the reason for node {node!r} must be printable text of at most {MAX_REASON} "
            "characters"
        )
    known = {n.name for n in store.nodes()}
    if node not in known:
        raise NodeNotInInventory(
            f"node {node!r} is not in the inventory; check the name with `llmgw nodes list`"
        )
    mode = MODES[action]
    before = store.cordon(node, mode, actor=actor, reason=reason)
    left = sum(1 for p, _ in store.replicas(node=node))
    changed = (before.mode if before else None) != mode
    return ServiceChange(node, action, before, changed, left)


def service_label(cordon: Cordon | None, replicas_left: int) -> str:
    """What `nodes list` shows: in service, cordoned, or draining (k replicas left)."""
    if cordon is None:
        return "-"
    if cordon.draining:
        return f"draining ({replicas_left} replica{'s' if replicas_left != 1 else ''} left)"
    return "cordoned"


@dataclass(frozen=True, slots=True)
class ReplicaCounts:
    wanted: int
    placed: int
    ready: int


def replica_counts(
    catalog: Catalog, replicas: Sequence[tuple[Placement, ReplicaStatus]]
) -> Mapping[str, ReplicaCounts]:
    """Per model: replicas wanted (scaling.min), placed, and ready (or unreported)."""
    placed: dict[str, int] = {}
    ready: dict[str, int] = {}
    for p, status in replicas:
        placed[p.model] = placed.get(p.model, 0) + 1
        ready[p.model] = ready.get(p.model, 0) + status.counts_as_ready
    return {
        m.name: ReplicaCounts(m.scaling.min, placed.get(m.name, 0), ready.get(m.name, 0))
        for m in catalog.models()
    }
