"""The planner's objective, counted on a set of placements: what the exact program maximises.

The order is the planner's own (``scheduler.planner.order``, ``survivors``, ``spread``):

1. replicas placed, per priority tier, highest tier first: one more replica of a
   higher-priority model outweighs any number of lower ones (preemption's rule);
2. stability: current placements moved or dropped count against;
3. spread: each replica sharing a node with another of its model counts against.

GPUs placed are counted too, because the benches have always compared planners by
cards placed (``bench.placement``), and the openb question is one of cards.

Demands carry ``scaling.min`` only (``scheduler.planner.demands``), so there is no
surplus above min to rank below it yet: every wanted replica is a min replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.planner.placements import Demand, Placement


@dataclass(frozen=True, slots=True)
class Score:
    """The objective of one set of placements, term by term.

    ``tiers`` is (priority, replicas placed) from the highest priority down.
    """

    tiers: tuple[tuple[int, int], ...]
    moves: int
    colocated: int
    gpus: int

    @property
    def replicas(self) -> int:
        return sum(placed for _, placed in self.tiers)

    def key(self) -> tuple[int, ...]:
        """Larger is better, compared lexicographically."""
        return (*(placed for _, placed in self.tiers), -self.moves, -self.colocated)


def tiers(demands: Sequence[Demand]) -> list[int]:
    """The priorities present, highest first."""
    return sorted({d.priority for d in demands}, reverse=True)


def score(
    demands: Sequence[Demand],
    placements: Sequence[Placement],
    current: Sequence[Placement] = (),
) -> Score:
    """Count ``placements`` (the round's outcome) against ``demands`` and ``current``.

    A replica beyond its model's wanted count is not counted; a current placement
    whose (model, replica, nodes, profile) is not among ``placements`` is a move.
    """
    wanted = {d.model: max(d.replicas, 0) for d in demands}
    priority = {d.model: d.priority for d in demands}
    placed: dict[str, int] = {}
    per_node: dict[tuple[str, str], int] = {}
    gpus = 0
    for p in sorted(placements, key=lambda p: (p.model, p.replica)):
        if p.model not in wanted or placed.get(p.model, 0) >= wanted[p.model]:
            continue
        placed[p.model] = placed.get(p.model, 0) + 1
        gpus += p.gpus_per_node * len(p.nodes)
        for name in p.nodes:
            per_node[(p.model, name)] = per_node.get((p.model, name), 0) + 1
    by_tier: dict[int, int] = {}
    for model, count in placed.items():
        by_tier[priority[model]] = by_tier.get(priority[model], 0) + count
    still = {(p.model, p.replica, p.nodes, p.profile) for p in placements}
    moves = sum((p.model, p.replica, p.nodes, p.profile) not in still for p in current)
    return Score(
        tiers=tuple((t, by_tier.get(t, 0)) for t in tiers(demands)),
        moves=moves,
        colocated=sum(c - 1 for c in per_node.values() if c > 1),
        gpus=gpus,
    )
