"""Spreading a round's new replicas after the quality floor has chosen how to place them.

The quality floor (``scheduler.planner.packing``) keeps plain best fit or first fit
when either places more GPUs than the round's own way, and neither spreads:
at 5,000 and 10,000 synthetic nodes they won, and hundreds of models had two
replicas on one node while a fitting node without one existed. This pass
repairs that without giving the GPUs back. For each new replica sharing a node
(or, with ``spread_by``, a crowded label value) with others of its model:

1. **Swap** it with a new replica of another model of the same shape (GPU
   class, GPUs per node, memory per node, node count): each takes the other's
   nodes. Every node then carries exactly what it carried, so nothing can be
   overcommitted and the GPU count cannot change. Both profiles must admit
   their new nodes (class, labels, the model's back-off; the nodes were fresh
   and open, since a replica was placed there this round), and a gang's nodes
   stay the gang's fabric.
2. Failing that, **move** it to nodes with free room left, chosen as the round's
   own way chooses (spread first, then best fit): the same replica on other
   cards, so the GPU count cannot change either, and the room is checked as
   for any placement.

A change is made only when it makes the moved replica's model strictly better
spread and the other model (of a swap) no worse, by the model's own rule: with
``spread_by``, first no more replicas on nodes without the label, then the
replicas per label value as even as possible (sum of squared counts), then
per node; without it, per node only. That measure falls with every change and
never rises, so the pass ends; it ends with no such swap or move left (the
invariant the tests hold).

Never touched: running replicas (the stability rule: a running replica moves
only with a reason, and spread is not one), the old side of a rollout, a
replica placed by evicting others (it goes where its evictions made room, as
its story says), and the gangs of a model with ``spread_required`` (its rule
is judged per value when placed; a gang's sum could hide a value crowded past
the skew). A single replica of a ``spread_required`` model may move: moving
one replica to a value holding fewer never widens the skew.

A round must stay a fixed point of itself (the next round, with nothing
changed, changes nothing). So partners share a priority as well as a shape
(every node then keeps which priorities hold it, and a replica left unplaced
finds no new victims next round), a model with ``spread_required`` and a
replica unplaced is not touched (that replica waits for a value its placed
ones decide), and a move is made only when the room it frees is of no use to
any unplaced replica's profile and it adds no victim for a higher-priority one.

Pure and deterministic: candidates in (model, replica) order, partners by node
name from where the last swap of the shape left off, the first partner that
reaches the best possible change taken. Cost: nothing when nothing new was
placed (an idle round); otherwise O(P) to index the new replicas by shape,
priority and node, and per crowded candidate a scan of the nodes holding its
shape, a whole node skipped in one look-up when its model is as crowded there:
about a tenth of a round from nothing placed at 5,000 and 10,000 synthetic
nodes. Every change is a note on the plan (``place`` prints them with ``~``).

The pass lives here; its parts each in their own module: the index of movable
replicas by shape and node (``scheduler.planner.repair_groups``), the score and what a
change does to it (``scheduler.planner.repair_score``), and what a change may not do to
a round with replicas unplaced (``scheduler.planner.repair_guard``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.capacity import Capacity
from scheduler.planner.fleet.placements import Demand, Placement
from scheduler.planner.repair_groups import BUILD_AFTER, Group, Shape, shape_of
from scheduler.planner.repair_guard import Guard
from scheduler.planner.repair_score import ZERO, Score, Scorer
from scheduler.planner.spread import Choice, Spread


@dataclass(slots=True)
class Repaired:
    """The round's new placements after the repair, and one note per change."""

    placed: list[Placement]
    notes: list[tuple[str, str]] = field(default_factory=list)
    swaps: int = 0
    moves: int = 0


def repair(
    demands: Sequence[Demand],
    placed: Sequence[Placement],
    spread: Spread,
    capacity: Capacity,
    *,
    eligible: Callable[[PlacementProfile], Sequence[str]],
    avoid: Mapping[str, frozenset[str]] | None = None,
    fixed: Collection[tuple[str, int]] = (),
    unplaced: Mapping[str, Sequence[PlacementProfile]] | None = None,
    index_after: int | None = BUILD_AFTER,
) -> Repaired:
    """Swap and move ``placed`` (this round's new replicas) to spread their models.

    ``spread`` counts every replica that runs (kept and new) and ``capacity``
    is what is left free; both are updated in place. ``eligible`` maps a
    profile to the fresh, open nodes of its class and labels (``Attempt.eligible_nodes``);
    ``fixed`` are (model, replica) slots not to touch (preemptors);
    ``unplaced`` the profiles tried, per model, for replicas the round leaves
    unplaced: nothing is changed that could let one of them be placed next round.
    ``index_after``: nodes a shape's scans read per member before its partner index
    (``Group.partner_keys``) is built; None scans every node of the shape for each
    candidate, as before the index. The plan is the same either way: the others are
    kept for ``bench.placement.spread_repair`` and the test that holds them equal.
    """
    out = Repaired(list(placed))
    if not placed:
        return out
    pass_ = _Pass(
        demands,
        out,
        spread,
        capacity,
        eligible,
        avoid or {},
        frozenset(fixed),
        unplaced or {},
        index_after=index_after,
    )
    # Each change lowers one model's score and raises none, so this ends; in
    # practice after two or three passes.
    while pass_.run():
        pass
    return out


class _Pass:
    def __init__(  # noqa: PLR0917
        self,
        demands: Sequence[Demand],
        out: Repaired,
        spread: Spread,
        capacity: Capacity,
        eligible: Callable[[PlacementProfile], Sequence[str]],
        avoid: Mapping[str, frozenset[str]],
        fixed: frozenset[tuple[str, int]],
        unplaced: Mapping[str, Sequence[PlacementProfile]],
        *,
        index_after: int | None,
    ) -> None:
        self.out = out
        self.spread = spread
        self.capacity = capacity
        self.eligible = eligible
        self.avoid = avoid
        self.fixed = fixed
        self.rules = {d.model: d for d in demands}
        self.profiles: dict[tuple[str, str], PlacementProfile] = {
            (d.model, p.name): p for d in demands for p in d.profiles
        }
        self.score = Scorer(spread, self.rules, self.profiles, eligible)
        self.guard = Guard(spread.inventory, self.rules, unplaced)
        self.unspreadable = {m for m in unplaced if self.rules[m].spread_required}
        # Models whose score is per node only: a swap's effect on them is two look-ups.
        self.plain = frozenset(m for m, d in self.rules.items() if d.spread_by is None)
        # The movable new replicas by shape, then by the nodes they are on: a
        # candidate skips a whole node (often dozens of stacked replicas) with
        # one look-up when its model is as crowded there. One-node shapes are
        # also indexed by partner (``Group.partner_keys``) once their scans have read
        # ``index_after`` nodes per member (``repair_groups.BUILD_AFTER`` says why),
        # kept current through ``_relocate`` in every built group where the moved
        # replica's model has members (``groups_of``).
        self.index_after = index_after
        self.groups: dict[Shape, Group] = {}
        self.groups_of: dict[str, list[Group]] = {}
        for index, p in enumerate(out.placed):
            if self._movable(p):
                shape = self._shape(p)
                group = self.groups.get(shape)
                if group is None:
                    one_node = index_after is not None and shape[3] == 1
                    group = self.groups[shape] = Group(spread.on_node if one_node else None)
                group.add(p.nodes, index, p.model)
        self.slot = lambda i: (out.placed[i].model, out.placed[i].replica)
        for group in self.groups.values():
            group.settle(self.slot)

    def run(self) -> bool:
        """Swaps for every crowded replica, then moves for those still crowded: whether
        anything changed. Apart, because a moved replica is a node of its own to scan
        for every later candidate, and most candidates a move serves have no swap."""
        changed = False
        placed = self.out.placed
        for change in (self._swap, self._move):
            order = sorted(
                (i for group in self.groups.values() for i in group.members()),
                key=self.slot,
            )
            for index in order:
                if self.score.crowded(placed[index]) and change(index):
                    changed = True
        return changed

    # -- candidates ---------------------------------------------------------------------

    def _movable(self, p: Placement) -> bool:
        if (p.model, p.replica) in self.fixed or (p.model, p.profile) not in self.profiles:
            return False
        if p.model in self.unspreadable:
            # Its unplaced replica waits for a value its placed ones decide.
            return False
        return not (len(p.nodes) > 1 and self.rules[p.model].spread_required)

    def _shape(self, p: Placement) -> Shape:
        return shape_of(p, self.rules[p.model].priority)

    # -- swaps ----------------------------------------------------------------------------

    def _swap(self, index: int) -> bool:
        placed = self.out.placed
        a = placed[index]
        shape = self._shape(a)
        group = self.groups[shape]
        profile = self.profiles[(a.model, a.profile)]
        avoid_a = self.avoid.get(a.model, frozenset())
        counts = self.spread.on_node
        on_a = counts.get(a.model, {})
        ideal = self.score.ideal(a)
        best: tuple[Score, Score, int] | None = None
        # Nodes are visited from where the last swap of this shape left off, so
        # that the same few are not offered (and refused) to every candidate.
        # Indexed, only the nodes where the gain is negative and some partner's
        # cost is not positive, in the same order: the others change nothing below.
        indexed = group.indexed and a.model in self.plain
        if indexed and not group.built and group.scanned >= (self.index_after or 0) * group.size:
            for model in group.build(lambda i: placed[i].model):
                self.groups_of.setdefault(model, []).append(group)
        if indexed and group.built:
            keys = group.partner_keys(a.model, a.nodes[0], on_a.get(a.nodes[0], 0) - 2, self.plain)
        else:
            keys = group.keys_from(group.cursor)
        for there in keys:
            if set(there) & set(a.nodes):
                continue
            if len(there) == 1 and ideal[:2] == (0, 0):
                # One node, spread per node only: the gain in two look-ups.
                gain: Score = (0, 0, 2 * (on_a.get(there[0], 0) - on_a.get(a.nodes[0], 0) + 1))
            else:
                gain = self.score.delta(a.model, a.nodes, there)
            if gain >= ZERO or (best is not None and gain > best[0]):
                continue
            if not self.guard.admits(profile, there, avoid_a):
                continue
            # Whether a partner may go to ``a``'s nodes depends on its model and profile
            # only: judged once per node, however many replicas of it are stacked there.
            judged: set[tuple[str, str]] = {(a.model, a.profile)}
            for other in group.at(there):
                b = placed[other]
                if (b.model, b.profile) in judged or b.model == a.model:
                    continue
                judged.add((b.model, b.profile))
                cost = self.score.delta(b.model, there, a.nodes)
                if cost > ZERO or (best is not None and (gain, cost) >= best[:2]):
                    continue
                other_profile = self.profiles[(b.model, b.profile)]
                if self.guard.admits(other_profile, a.nodes, self.avoid.get(b.model, frozenset())):
                    best = (gain, cost, other)
                    break
            if best is not None and best[0] <= ideal:
                break
        if best is None:
            return False
        b = placed[best[2]]
        group.cursor = b.nodes
        self._relocate(index, b.nodes)
        self._relocate(best[2], a.nodes)
        self.out.swaps += 1
        self.out.notes.append(
            (
                a.model,
                f"replica {a.replica} moved from {_names(a.nodes)} to {_names(b.nodes)}, "
                f"swapping nodes with {b.model}[{b.replica}] (same shape, so no node's use "
                f"changed): {a.model}'s replicas are spread",
            )
        )
        self.out.notes.append(
            (
                b.model,
                f"replica {b.replica} moved from {_names(b.nodes)} to {_names(a.nodes)}, "
                f"swapping nodes with {a.model}[{a.replica}] (same shape) to spread "
                f"{a.model}'s replicas; {b.model}'s spread is no worse",
            )
        )
        return True

    # -- moves into free room ------------------------------------------------------------

    def _move(self, index: int) -> bool:
        a = self.out.placed[index]
        profile = self.profiles[(a.model, a.profile)]
        capacity, spread = self.capacity, self.spread
        # Where the round's own way would put it with its own share given back.
        capacity.release(a.nodes, a.gpus_per_node, a.memory_gb_per_node)
        spread.remove(a.model, a.nodes)
        target = None
        if capacity.may_fit(profile):
            target = self._choose(a.model, profile, self.avoid.get(a.model, frozenset()))
        spread.add(a.model, a.nodes)
        if (
            target is None
            or self.score.delta(a.model, a.nodes, target) >= ZERO
            or not self.guard.inert(a, target)
        ):
            capacity.consume(a.nodes, a.gpus_per_node, a.memory_gb_per_node)
            return False
        capacity.consume(target, a.gpus_per_node, a.memory_gb_per_node)
        self._relocate(index, target)
        self.out.moves += 1
        self.out.notes.append(
            (
                a.model,
                f"replica {a.replica} moved from {_names(a.nodes)} to {_names(target)}, "
                f"where free room was left: {a.model}'s replicas are spread",
            )
        )
        return True

    def _choose(
        self, model: str, profile: PlacementProfile, avoid: frozenset[str]
    ) -> tuple[str, ...] | None:
        """Where the round's own way would put the replica now (spread, then best fit)."""

        def eligible() -> Sequence[str]:
            return self.eligible(profile)

        fitting = self.capacity.fitting(profile, avoid)
        if profile.nodes > 1:
            gang = self.spread.choose_gang(
                model, list(fitting), profile.nodes, eligible, prefer=True
            )
            return None if isinstance(gang, Choice) else gang
        choice = self.spread.choose(model, (e[2] for e in fitting), eligible, prefer=True)
        return None if choice.node is None else (choice.node,)

    # -- bookkeeping ----------------------------------------------------------------------

    def _relocate(self, index: int, nodes: tuple[str, ...]) -> None:
        p = self.out.placed[index]
        self.spread.remove(p.model, p.nodes)
        self.spread.add(p.model, nodes)
        self.out.placed[index] = replace(p, nodes=nodes)
        group = self.groups[self._shape(p)]
        group.remove(p.nodes, index, p.model)
        group.add(nodes, index, p.model)
        group.settle(self.slot, nodes)
        # The model's counts moved on both sides, wherever it is indexed.
        for other in self.groups_of.get(p.model, ()):
            for name in (*p.nodes, *nodes):
                other.recount(p.model, name)


def _names(nodes: Sequence[str]) -> str:
    return ", ".join(nodes)
