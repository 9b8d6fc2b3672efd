"""Placing a replica again where its engine still runs: a node given up and back.

A node silent for ``stale_after`` plus ``grace`` is lost: its replicas are left
unplaced or placed elsewhere, though its engines may run on (what went away may be
the control plane, or the network). When its agent comes back it reports those
engines (``Lifecycle.running``, kept from its reports) and holds them a while
(``agent.runtime``) rather than stopping them. This step, after the current
placements are kept and before new replicas are placed, places each such replica
again on the node where it runs when:

- the node is fresh again, not draining, of the profile's class and labels, and has
  room for it;
- the model still wants that slot (``replica`` below its wanted count), and the
  engine runs the model's current version with one of its profiles that runs on
  one node;
- the slot is empty, or holds a replacement elsewhere that is not ready yet: an
  engine that runs beats one still starting, which is removed.

A replacement already *ready* elsewhere wins: the routers send it requests, and
taking the replica back would stop a serving engine to keep another one. The
returning copy is then stopped by its agent once its hold is over.

Pure, like the rest of the planner. The running copies are a round input, recorded
with the round (``Lifecycle.to_json``), so ``explain --round`` plans it again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from scheduler.lifecycle.inputs import Lifecycle, RunningCopy
from scheduler.lifecycle.replica_reports import READY
from scheduler.planner.fleet.capacity import Capacity
from scheduler.planner.fleet.placements import Demand, Placement, Removal


@dataclass(frozen=True, slots=True)
class Readopted:
    """Replicas placed again where they run, and the replacements removed for them."""

    placements: tuple[Placement, ...] = ()
    removals: tuple[Removal, ...] = ()
    # The engine each placement is, in the same order.
    copies: tuple[RunningCopy, ...] = ()
    # (model, note) lines for the plan: what was placed again, and where.
    notes: tuple[tuple[str, str], ...] = ()


def _order(copy: RunningCopy) -> tuple[bool, str, int, str]:
    # A ready copy before a starting one of the same slot (two nodes back at once).
    return copy.state != READY, copy.model, copy.replica, copy.node


def readopt(
    demands: Sequence[Demand],
    kept: Sequence[Placement],
    lifecycle: Lifecycle,
    capacity: Capacity,
    *,
    fresh: Collection[str],
    taken: Collection[tuple[str, int]] = frozenset(),
) -> Readopted:
    """See the module. ``kept`` have consumed ``capacity``; the placements returned take
    theirs from it, and the removals give theirs back. ``taken``: slots a rollout holds
    or reserves this round, which are left alone."""
    if not lifecycle.running:
        return Readopted()
    by_model: Mapping[str, Demand] = {d.model: d for d in demands}
    slots = {(p.model, p.replica): p for p in kept}
    draining = lifecycle.draining_nodes
    placed: list[Placement] = []
    copies: list[RunningCopy] = []
    removals: list[Removal] = []
    notes: list[tuple[str, str]] = []
    for copy in sorted(lifecycle.running, key=_order):
        key = (copy.model, copy.replica)
        demand = by_model.get(copy.model)
        if demand is None or demand.lifecycle is None or key in taken:
            continue
        version = demand.lifecycle.version
        if copy.replica >= demand.replicas or not version or copy.version != version:
            continue
        if copy.node not in fresh or copy.node in draining:
            continue
        profile = next((p for p in demand.profiles if p.name == copy.profile), None)
        if profile is None or profile.nodes != 1 or copy.node not in capacity.eligible(profile):
            continue
        current = slots.get(key)
        if current is not None:
            status = lifecycle.statuses.get(key)
            if copy.node in current.nodes or current.moving:
                continue
            if status is None or status.counts_as_ready:
                continue  # ready elsewhere: that placement wins (the module)
            capacity.release(current.nodes, current.gpus_per_node, current.memory_gb_per_node)
        if not capacity.take((copy.node,), profile.gpus_per_node, profile.min_memory_gb):
            if current is not None:
                capacity.consume(current.nodes, current.gpus_per_node, current.memory_gb_per_node)
            continue
        again = Placement(
            model=copy.model,
            replica=copy.replica,
            profile=profile.name,
            nodes=(copy.node,),
            gpus_per_node=profile.gpus_per_node,
            gpu_class=profile.gpu_class,
            memory_gb_per_node=profile.min_memory_gb,
            fingerprint=demand.lifecycle.fingerprints.get(profile.name, ""),
            version=version,
        )
        if current is not None:
            removals.append(
                Removal(
                    current,
                    f"its engine still runs on {copy.node} ({copy.state}), back after the "
                    "node was given up, and this replacement was not ready yet",
                )
            )
        slots[key] = again
        placed.append(again)
        copies.append(copy)
        notes.append(
            (
                copy.model,
                f"replica {copy.replica} placed again on {copy.node}, where its engine "
                f"still runs ({copy.state}) after the node was given up",
            )
        )
    return Readopted(tuple(placed), tuple(removals), tuple(copies), tuple(notes))
