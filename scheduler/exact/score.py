"""The planner's objective, counted on a set of placements: what the exact program maximises.

The order is the planner's own, as ``scheduler.planner.packing`` ranks the ways of
placing a round (``_score``) and ``survivors`` and ``spread`` keep and spread them:

1. per priority tier, highest tier first: one more card placed at a higher tier
   outweighs anything below it (preemption's rule);
2. GPUs placed in the tier, then replicas placed in the tier: the planner keeps the
   way of placing with the most GPUs, and ranks replicas only between equal GPU
   counts, so that an oversubscribed cluster is not filled with one-card replicas
   while the gangs that need whole nodes never place;
3. stability: current placements moved or dropped count against;
4. spread: each replica sharing a node with another of its model counts against.

The issue that asked for this reference (29) named "replicas placed" as the second
term. The planner never ranked by it: counting replicas first against a planner that
counts GPUs first compared two different objectives (on synthetic 1,000, 1,261
replicas against 1,805 from an optimum that starves every gang). ``replicas_key``
is that other order, kept for the benches that report both.

Demands carry ``scaling.min`` (or the autoscaler's count) only
(``scheduler.planner.demands``), so there is no surplus above min to rank below it
yet: every wanted replica is a min replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.planner.fleet.placements import Demand, Placement


@dataclass(frozen=True, slots=True)
class Score:
    """The objective of one set of placements, term by term.

    ``tiers`` is (priority, replicas placed) and ``tier_gpus`` (priority, GPUs placed),
    both from the highest priority down.
    """

    tiers: tuple[tuple[int, int], ...]
    moves: int
    colocated: int
    gpus: int
    tier_gpus: tuple[tuple[int, int], ...] = ()

    @property
    def replicas(self) -> int:
        return sum(placed for _, placed in self.tiers)

    def key(self) -> tuple[int, ...]:
        """The planner's order (see module); larger is better, compared lexicographically."""
        return (
            *(gpus for _, gpus in self.tier_gpus),
            *(placed for _, placed in self.tiers),
            -self.moves,
            -self.colocated,
        )

    def replicas_key(self) -> tuple[int, ...]:
        """Replicas per tier first, then moves and spread (issue 29's wording)."""
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
    by_tier_gpus: dict[int, int] = {}
    per_node: dict[tuple[str, str], int] = {}
    gpus = 0
    for p in sorted(placements, key=lambda p: (p.model, p.replica)):
        if p.model not in wanted or placed.get(p.model, 0) >= wanted[p.model]:
            continue
        placed[p.model] = placed.get(p.model, 0) + 1
        cards = p.gpus_per_node * len(p.nodes)
        gpus += cards
        by_tier_gpus[priority[p.model]] = by_tier_gpus.get(priority[p.model], 0) + cards
        for name in p.nodes:
            per_node[(p.model, name)] = per_node.get((p.model, name), 0) + 1
    by_tier: dict[int, int] = {}
    for model, count in placed.items():
        by_tier[priority[model]] = by_tier.get(priority[model], 0) + count
    still = {(p.model, p.replica, p.nodes, p.profile) for p in placements}
    moves = sum((p.model, p.replica, p.nodes, p.profile) not in still for p in current)
    order = tiers(demands)
    return Score(
        tiers=tuple((t, by_tier.get(t, 0)) for t in order),
        moves=moves,
        colocated=sum(c - 1 for c in per_node.values() if c > 1),
        gpus=gpus,
        tier_gpus=tuple((t, by_tier_gpus.get(t, 0)) for t in order),
    )
