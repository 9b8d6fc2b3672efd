"""Defragmentation: the fewest moves of other replicas that make room for an unplaced one.

Spread puts a model's replicas on distinct nodes, which is what fragments a cluster: 56
one-card replicas on 8 nodes of 8 cards leave one free card per node, and an 8-card
replica fits nowhere although 8 cards are free. Preemption cannot help (equal
priority), and nothing else moves a running replica.

``moves_for`` answers, for one unplaced single-node replica: on which node, by moving
which replicas where, it would fit, with the fewest moves. A replica may be moved only
if its model's priority is equal or lower, its model allows moves (``movable``), and
the moves of its model stay within its disruption budget (``budget``: how many of its
replicas may be in motion at once). Each moved replica must itself fit somewhere else
(right class, labels, memory, free cards once earlier moves are counted), never on the
node being cleared. Among nodes, the fewest moves win, then the fewest GPUs moved,
then the node name: the answer is a function of the inputs alone.

Pure: it reads a ``Capacity`` copy and the placements, and changes neither. It says
what to move; executing a move surge-first (the new copy ready before the old stops)
is the lifecycle's business. Not wired into ``plan.plan`` yet (see docs/operator/
defragmentation.md).

Cost: O(N x k log k) for N nodes of the profile's class and k replicas per node, plus
O(m x L log N) per candidate move (best-fit search for its destination).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from catalog.views import PlacementProfile
from scheduler.planner.capacity import Capacity
from scheduler.planner.fit import gpus_fit, memory_fits
from scheduler.planner.placements import Placement


@dataclass(frozen=True, slots=True)
class Move:
    """One replica to run on ``to`` instead of where it runs, and why."""

    placement: Placement
    to: str
    reason: str


@dataclass(frozen=True, slots=True)
class Defrag:
    """Moves that make room on ``node`` for ``model`` with ``profile``; or why none do."""

    model: str
    profile: str
    node: str | None
    moves: tuple[Move, ...]
    refusal: str = ""


def moves_for(
    model: str,
    priority: int,
    profile: PlacementProfile,
    capacity: Capacity,
    placements: Sequence[Placement],
    *,
    priorities: Mapping[str, int],
    budget: Mapping[str, int],
    profiles: Mapping[tuple[str, str], PlacementProfile],
    movable: Mapping[str, bool] | None = None,
) -> Defrag:
    """The fewest moves that make room for one replica of ``model`` (see module).

    ``profiles``: (model, profile name) -> the profile a running replica was placed
    with, whose class, labels and memory its destination must meet. ``budget``: per
    model, how many of its replicas may be in motion at once; absent, no limit:
    a move is surge-first, so it never takes a model below the replicas it has ready."""
    if profile.nodes > 1:
        return Defrag(model, profile.name, None, (), "multi-node replicas are not defragmented")
    on_node: dict[str, list[Placement]] = {}
    for p in placements:
        if len(p.nodes) == 1:
            on_node.setdefault(p.nodes[0], []).append(p)
    blocked_by_budget: set[str] = set()
    best: tuple[tuple[int, int, str], tuple[Move, ...]] | None = None
    for name in capacity.eligible(profile):
        found = _clear(
            name,
            model,
            priority,
            profile,
            capacity,
            here=on_node.get(name, []),
            priorities=priorities,
            budget=budget,
            movable=movable or {},
            blocked_by_budget=blocked_by_budget,
            profiles=profiles,
        )
        if found is None:
            continue
        key = (len(found), sum(m.placement.gpus_per_node for m in found), name)
        if best is None or key < best[0]:
            best = (key, found)
    if best is None:
        why = "no node can be cleared by moving replicas of equal or lower priority"
        if blocked_by_budget:
            models = ", ".join(sorted(blocked_by_budget))
            why += f"; the disruption budget of {models} stood in the way"
        return Defrag(model, profile.name, None, (), why)
    return Defrag(model, profile.name, best[0][2], best[1])


def _clear(
    name: str,
    model: str,
    priority: int,
    profile: PlacementProfile,
    capacity: Capacity,
    *,
    here: list[Placement],
    priorities: Mapping[str, int],
    budget: Mapping[str, int],
    movable: Mapping[str, bool],
    blocked_by_budget: set[str],
    profiles: Mapping[tuple[str, str], PlacementProfile],
) -> tuple[Move, ...] | None:
    """The fewest replicas on ``name`` to move elsewhere so that ``profile`` fits there."""
    gpus, memory = capacity.free_gpus(name), capacity.free_memory(name)
    if gpus_fit(gpus, profile.gpus_per_node) and memory_fits(memory, profile.min_memory_gb):
        return ()  # it fits as it is: nothing to move (the planner would have placed it)
    candidates = sorted(
        (
            p
            for p in here
            if p.model != model
            and priorities.get(p.model, 0) <= priority
            and movable.get(p.model, True)
        ),
        # Largest first: the fewest moves free the most cards.
        key=lambda p: (-p.gpus_per_node, -p.memory_gb_per_node, p.model, p.replica),
    )
    trial = capacity.copy()
    spent: dict[str, int] = {}
    moves: list[Move] = []
    for victim in candidates:
        if gpus_fit(gpus, profile.gpus_per_node) and memory_fits(memory, profile.min_memory_gb):
            break
        limit = budget.get(victim.model)
        if limit is not None and spent.get(victim.model, 0) >= limit:
            blocked_by_budget.add(victim.model)
            continue
        own = profiles.get((victim.model, victim.profile))
        to = None if own is None else _destination(victim, name, trial, own)
        if to is None:
            continue
        trial.consume((to,), victim.gpus_per_node, victim.memory_gb_per_node)
        spent[victim.model] = spent.get(victim.model, 0) + 1
        gpus += victim.gpus_per_node
        memory = None if memory is None else memory + victim.memory_gb_per_node
        moves.append(
            Move(
                victim,
                to,
                f"to make room for model {model}, profile {profile.name} on node {name}",
            )
        )
    if gpus_fit(gpus, profile.gpus_per_node) and memory_fits(memory, profile.min_memory_gb):
        return tuple(moves)
    return None


def _destination(
    victim: Placement, away_from: str, capacity: Capacity, profile: PlacementProfile
) -> str | None:
    """The best-fitting other fresh node of the victim's own profile (class, labels, memory)."""
    for _, _, name in capacity.fitting(profile):
        if name != away_from:
            return name
    return None
