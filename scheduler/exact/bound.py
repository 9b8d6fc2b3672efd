"""A ceiling of the GPUs any round can place, from identical nodes taken together.

``scheduler.exact.program`` works node by node, and within its work limit CP-SAT's proven
bound there can stay above the cluster's own card count (openb with the trace's pods:
7,906 for 6,212 cards; synthetic 5,000: 22,152 for 20,085), so it proves nothing about
the cards a plan leaves idle. This relaxation is small enough to solve to the end:

- nodes that are alike for placing (class, usable cards, memory, labels, whether in a
  fabric) are one **node type** of ``N`` nodes; demands with the same profiles are one
  group (replicas added up);
- ``x[j, p, t]``: units of group ``j`` with profile ``p`` on nodes of type ``t`` (a unit
  is one replica on one node, ``k`` units per ``k``-node gang), ``z[j, p]`` replicas,
  ``sum_t x = k z`` and ``sum_p z <= wanted``;
- per type, cards used ``<= N * C``, where ``C`` is the most cards **one** node of the
  type can carry with the shapes (cards, memory) that fit it, both limits at once (an
  exact knapsack by dynamic programming): a node with 7 usable cards and only 2-, 4-
  and 8-card profiles carries 6, and one with 128 GB whose cheapest fitting replica
  asks for 46 GB per card carries 2;
- per type, memory used ``<= N * M``; replicas with more than half a node's cards (or
  memory) at most one per node: ``sum <= N``.

Every packing of the real round satisfies these (sum its per-node counts over each
type), so the relaxation's optimum, or CP-SAT's proven bound of it, is a ceiling of
the GPUs placed. Left out, which only loosens it: fabrics' membership (a gang's nodes
in one fabric), spread, one node's several shapes beyond the per-node ceiling.
Deterministic: types and groups in a fixed order, one worker, a fixed work limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from catalog.definition.views import PlacementProfile
from scheduler.exact.fill import fresh_nodes
from scheduler.planner.fleet.fit import gpu_class_matches, missing_label, selector_key
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand

# OR-Tools (and pandas and numpy, which it loads: ~0.5 s of CPU) is imported when a
# program is built, not with the module: whatever imports this floor without solving
# (a test module being collected, on every xdist worker) does not pay for it.
if TYPE_CHECKING:
    from ortools.sat.python import cp_model

# A replica's use of one node: cards, memory (GB).
Shape = tuple[int, int]


@dataclass(frozen=True, slots=True)
class NodeType:
    """Fresh nodes alike for placing, and what one of them can carry at most."""

    example: Node
    count: int
    cards: int  # usable cards of one node (less reserved)
    memory: int | None  # whole GB, None when not reported
    most_cards: int  # the per-node ceiling (see module)


@dataclass(frozen=True, slots=True)
class Bound:
    """``gpus``: no round on these nodes places more cards (proven, see module).

    ``status`` is CP-SAT's on the relaxation: ``optimal`` (``gpus`` is the relaxation's
    optimum) or ``feasible`` (the work limit stopped it; ``gpus`` is its proven bound).
    ``cards`` is the fresh nodes' usable cards, the trivial ceiling, ``per_node`` the
    sum of the per-node ceilings (the relaxation before it counts any demand).
    """

    gpus: int
    status: str
    cards: int
    per_node: int
    types: tuple[NodeType, ...]
    groups: int


def node_types(
    nodes: Sequence[Node], now: datetime, stale_after: timedelta = timedelta(seconds=90)
) -> list[tuple[Node, int]]:
    """Fresh GPU nodes alike for placing, as (first by name, how many), by first name."""
    by_key: dict[tuple[object, ...], list[Node]] = {}
    for n in fresh_nodes(nodes, now, stale_after):
        if n.gpus - n.gpus_reserved <= 0:
            continue
        key = (
            n.gpu_class,
            n.gpus - n.gpus_reserved,
            None if n.memory_gb is None else math.floor(n.memory_gb),
            selector_key(n.labels),
            n.fabric is not None,
        )
        by_key.setdefault(key, []).append(n)
    return [(members[0], len(members)) for members in by_key.values()]


def most_cards(cards: int, memory: int | None, shapes: Sequence[Shape]) -> int:
    """The most cards one node (``cards``, ``memory`` GB) carries with any number of
    replicas of ``shapes``: exact, by the least memory that uses exactly c cards."""
    least = [0] + [math.inf] * cards
    for c in range(1, cards + 1):
        for g, m in shapes:
            if 0 < g <= c and least[c - g] + m < least[c]:
                least[c] = least[c - g] + m
    # Unknown memory does not limit, but a count of cards no sum of shapes makes is
    # still out of reach (inf <= inf would let it in).
    room = math.inf if memory is None else memory
    return max(c for c in range(cards + 1) if least[c] < math.inf and least[c] <= room)


def _fits(node: Node, prof: PlacementProfile) -> bool:
    return (
        prof.gpus_per_node > 0
        and gpu_class_matches(node.gpu_class, prof)
        and missing_label(node.labels, prof.node_selector) is None
        and prof.gpus_per_node <= node.gpus - node.gpus_reserved
        and (node.memory_gb is None or prof.min_memory_gb <= node.memory_gb)
        and (prof.nodes <= 1 or node.fabric is not None)
    )


@dataclass(slots=True)
class _Group:
    """Demands whose GPU profiles ask the same of a node (names do not matter here)."""

    profiles: list[PlacementProfile]
    wanted: int


def _groups(demands: Sequence[Demand]) -> list[_Group]:
    # CPU profiles place no card: leaving them out only lets the bound count more.
    groups: dict[tuple[object, ...], _Group] = {}
    for d in demands:
        gpu_profiles = [p for p in d.profiles if p.gpus_per_node > 0]
        if not gpu_profiles or d.replicas <= 0:
            continue
        key = tuple(
            (
                p.gpu_class,
                p.gpus_per_node,
                max(p.nodes, 1),
                selector_key(p.node_selector),
                p.min_memory_gb,
            )
            for p in gpu_profiles
        )
        if key in groups:
            groups[key].wanted += d.replicas
        else:
            groups[key] = _Group(gpu_profiles, d.replicas)
    return list(groups.values())


if TYPE_CHECKING:
    Units = dict[tuple[int, int], list[cp_model.IntVar]]


def _node_type(
    model: cp_model.CpModel, node: Node, count: int, *, groups: list[_Group], units: Units
) -> NodeType:
    """One node type's variables (added to ``units``) and capacity constraints."""
    cards = node.gpus - node.gpus_reserved
    memory = None if node.memory_gb is None else math.floor(node.memory_gb)
    fitting = [
        (gi, pi, prof)
        for gi, g in enumerate(groups)
        for pi, prof in enumerate(g.profiles)
        if _fits(node, prof)
    ]
    shapes = sorted({(p.gpus_per_node, p.min_memory_gb) for *_, p in fitting})
    most = most_cards(cards, memory, shapes)
    used_cards: list[cp_model.LinearExprT] = []
    used_memory: list[cp_model.LinearExprT] = []
    big_cards: list[cp_model.IntVar] = []
    big_memory: list[cp_model.IntVar] = []
    for gi, pi, prof in fitting:
        g, m = prof.gpus_per_node, prof.min_memory_gb
        per_node = most // g
        if memory is not None and m > 0:
            per_node = min(per_node, memory // m)
        if per_node <= 0:
            continue
        x = model.new_int_var(0, count * per_node, f"x[{gi},{pi},{node.name}]")
        units.setdefault((gi, pi), []).append(x)
        used_cards.append(g * x)
        used_memory.append(m * x)
        # More than half a node's cards (or memory): two never share a node.
        if 2 * g > cards:
            big_cards.append(x)
        if memory is not None and 2 * m > memory:
            big_memory.append(x)
    if used_cards:
        model.add(sum(used_cards) <= count * most)
        if memory is not None:
            model.add(sum(used_memory) <= count * memory)
        for big in (big_cards, big_memory):
            if big:
                model.add(sum(big) <= count)
    return NodeType(node, count, cards, memory, most)


def gpu_bound(
    demands: Sequence[Demand],
    nodes: Sequence[Node],
    now: datetime,
    *,
    stale_after: timedelta = timedelta(seconds=90),
    work: float = 10.0,
) -> Bound:
    """The ceiling of the GPUs any round places on ``nodes`` for ``demands`` (see module)."""
    from ortools.sat.python import cp_model

    groups = _groups(demands)
    model = cp_model.CpModel()
    units: Units = {}
    types = tuple(
        _node_type(model, node, count, groups=groups, units=units)
        for node, count in node_types(nodes, now, stale_after)
    )
    placed: list[cp_model.LinearExprT] = []
    for gi, group in enumerate(groups):
        replicas = []
        for pi, prof in enumerate(group.profiles):
            xs = units.get((gi, pi), [])
            if not xs:
                continue
            k = max(prof.nodes, 1)
            z = model.new_int_var(0, group.wanted, f"z[{gi},{pi}]")
            model.add(sum(xs) == k * z)
            replicas.append(z)
            placed.append(prof.gpus_per_node * k * z)
        if replicas:
            model.add(sum(replicas) <= group.wanted)
    cards = sum(t.cards * t.count for t in types)
    per_node = sum(t.most_cards * t.count for t in types)
    if not placed:
        return Bound(0, "optimal", cards, per_node, types, len(groups))
    model.maximize(sum(placed))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = work
    solver.parameters.random_seed = 0
    status = solver.solve(model)
    found = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible"}
    if status not in found:
        # No answer within the limit: the per-node ceilings still hold.
        return Bound(per_node, "unknown", cards, per_node, types, len(groups))
    gpus = min(math.floor(solver.best_objective_bound + 1e-6), per_node)
    return Bound(gpus, found[status], cards, per_node, types, len(groups))
