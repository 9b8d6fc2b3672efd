"""A first-fit placer: the baseline ``plan()``'s quality is compared with.

The same fit rules as the planner (fresh nodes only; GPU class, free cards,
every selector label, memory where known; a multi-node profile on nodes of one
fabric), the same order (models as demanded, replica slots ascending, profiles
from highest priority down), but no search for the best node: each replica
takes the first node, by name, that fits. This is what a placer written in an
afternoon does, and what any real one must not fall below.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.capacity import Capacity
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement

STALE_AFTER = timedelta(seconds=90)


def _fits(
    node: Node, profile: PlacementProfile, gpus: dict[str, int], mem: dict[str, float | None]
) -> bool:
    if profile.gpu_class is not None and node.gpu_class != profile.gpu_class:
        return False
    if profile.gpus_per_node and gpus[node.name] < profile.gpus_per_node:
        return False
    if any(node.labels.get(k) != v for k, v in profile.node_selector.items()):
        return False
    free = mem[node.name]
    return profile.min_memory_gb <= 0 or free is None or free >= profile.min_memory_gb


def place(demands: Sequence[Demand], nodes: Sequence[Node], now: datetime) -> list[Placement]:
    fresh = sorted((n for n in nodes if now - n.reported_at <= STALE_AFTER), key=lambda n: n.name)
    gpus = {n.name: n.gpus - n.gpus_reserved for n in fresh}
    mem: dict[str, float | None] = {n.name: n.memory_gb for n in fresh}
    placed: list[Placement] = []
    for demand in demands:
        profiles = sorted(demand.profiles, key=lambda p: -p.priority)
        for replica in range(max(demand.replicas, 0)):
            for profile in profiles:
                chosen = _first(profile, fresh, gpus, mem)
                if chosen is None:
                    continue
                for name in chosen:
                    gpus[name] -= profile.gpus_per_node
                    free = mem[name]
                    if free is not None:
                        mem[name] = free - profile.min_memory_gb
                placed.append(
                    Placement(
                        demand.model,
                        replica,
                        profile.name,
                        chosen,
                        profile.gpus_per_node,
                        profile.gpu_class,
                        profile.min_memory_gb,
                    )
                )
                break
    return placed


def _first(
    profile: PlacementProfile,
    fresh: Sequence[Node],
    gpus: dict[str, int],
    mem: dict[str, float | None],
) -> tuple[str, ...] | None:
    if profile.nodes <= 1:
        for node in fresh:
            if _fits(node, profile, gpus, mem):
                return (node.name,)
        return None
    by_fabric: dict[str, list[str]] = {}
    for node in fresh:
        if node.fabric is None or not _fits(node, profile, gpus, mem):
            continue
        group = by_fabric.setdefault(node.fabric, [])
        group.append(node.name)
        if len(group) == profile.nodes:
            return tuple(group)
    return None


def best_fit(demands: Sequence[Demand], nodes: Sequence[Node], now: datetime) -> list[Placement]:
    """Plain best fit, the planner before placement policy: catalog order, no spread.

    The same order and fit rules as ``place``, but each replica takes the
    fitting node with the fewest free GPUs, then the least free memory, then the
    name (``Capacity.best_node``; gangs by ``Capacity.best_gang``).
    """
    fresh = frozenset(n.name for n in nodes if now - n.reported_at <= STALE_AFTER)
    capacity = Capacity(nodes, fresh)
    placed: list[Placement] = []
    for demand in demands:
        profiles = sorted(demand.profiles, key=lambda p: -p.priority)
        for replica in range(max(demand.replicas, 0)):
            for profile in profiles:
                if profile.nodes > 1:
                    chosen = capacity.best_gang(profile)
                else:
                    best = capacity.best_node(profile)
                    chosen = None if best is None else (best,)
                if chosen is None:
                    continue
                capacity.consume(chosen, profile.gpus_per_node, profile.min_memory_gb)
                placed.append(
                    Placement(
                        demand.model,
                        replica,
                        profile.name,
                        chosen,
                        profile.gpus_per_node,
                        profile.gpu_class,
                        profile.min_memory_gb,
                    )
                )
                break
    return placed
