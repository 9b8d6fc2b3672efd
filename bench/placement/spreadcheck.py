"""Checking a plan's spread: co-located replicas while a distinct node existed.

Issue 15's rule: by default the replicas of a model go on distinct nodes while a
fitting node without one exists. This checks a finished plan against it, by
brute force and independently of how the planner places or repairs (so a test
of the planner against it can fail): for every *new* replica (one the round
placed; a running replica moves only with a reason) that shares a node with
another replica of its model, it looks for a way to separate them that leaves
every other model no worse, of two kinds:

- **room**: nodes (one, or a gang's count on one fabric) with free room left
  for the replica's profile, fresh and open, of its class and labels, not
  avoided by the model, holding no replica of it;
- **swap**: a new replica of another model with the same shape (GPU class,
  GPUs and memory per node, node count) and priority, on nodes holding no replica of the
  model, whose own profile admits the first replica's nodes (labels, back-off)
  where its model has no replica, neither being a gang of a model with
  ``spread_required``, nor a preemptor (``fixed``).

For a model with ``spread_by`` the way must also leave both models' spread
over the label no less even (sum of squared replica counts per value not
higher, no more replicas on unlabelled nodes): there, sharing a node can be
the price of an even spread over the values.

The planner's repair (``scheduler.planner.spread_repair``) guarantees that no **swap**
is left, and no **room** when the round leaves nothing unplaced (otherwise it
moves a replica into free room only when that cannot make room, or a victim,
for an unplaced one: the next round must change nothing).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement


@dataclass(frozen=True)
class SpreadCheck:
    """Models with a new replica sharing a node with another of theirs, and why it is a fault."""

    colocated: frozenset[str] = frozenset()
    by_room: frozenset[str] = frozenset()
    by_swap: frozenset[str] = frozenset()
    # One (model, replica, other model, other replica) per model with a swap left.
    swaps: tuple[tuple[str, int, str, int], ...] = field(default_factory=tuple)

    @property
    def faults(self) -> frozenset[str]:
        """Models with co-located replicas while a distinct fitting node existed."""
        return self.by_room | self.by_swap


def check(
    demands: Sequence[Demand],
    nodes: Sequence[Node],
    placements: Sequence[Placement],
    new: Sequence[Placement],
    open_nodes: Collection[str],
    *,
    avoid: Mapping[str, Collection[str]] | None = None,
    fixed: Collection[tuple[str, int]] = (),
    unplaced: Collection[str] = (),
) -> SpreadCheck:
    """``placements``: every replica that runs after the plan (``new`` among them);
    ``open_nodes``: nodes that may take new work (fresh, not cordoned or draining);
    ``unplaced``: models with a replica left unplaced (one with ``spread_required``
    waits for a value its placed replicas decide, so none of them is a fault)."""
    rules = {d.model: d for d in demands}
    waiting = {m for m in unplaced if rules[m].spread_required}
    world = _World(demands, nodes, placements, open_nodes, avoid or {})
    movable = [p for p in new if (p.model, p.replica) not in fixed and p.model not in waiting]
    by_shape: dict[tuple[object, ...], list[Placement]] = {}
    for p in movable:
        by_shape.setdefault(_shape(p), []).append(p)
    colocated: set[str] = set()
    by_room: set[str] = set()
    by_swap: set[str] = set()
    swaps: list[tuple[str, int, str, int]] = []
    for a in movable:
        counts = world.on_node[a.model]
        profile = world.profiles.get((a.model, a.profile))
        if profile is None or not any(counts[name] >= 2 for name in a.nodes):
            continue
        colocated.add(a.model)
        if a.model not in by_room and world.room(a, profile):
            by_room.add(a.model)
        if a.model in by_swap or (len(a.nodes) > 1 and world.rules[a.model].spread_required):
            continue
        for b in by_shape[_shape(a)]:
            if world.swappable(a, profile, b):
                by_swap.add(a.model)
                swaps.append((a.model, a.replica, b.model, b.replica))
                break
    return SpreadCheck(frozenset(colocated), frozenset(by_room), frozenset(by_swap), tuple(swaps))


class _World:
    """The plan's placements counted per model and node, and what is left free per node."""

    def __init__(
        self,
        demands: Sequence[Demand],
        nodes: Sequence[Node],
        placements: Sequence[Placement],
        open_nodes: Collection[str],
        avoid: Mapping[str, Collection[str]],
    ) -> None:
        self.inventory = {n.name: n for n in nodes}
        self.rules = {d.model: d for d in demands}
        self.profiles = {(d.model, p.name): p for d in demands for p in d.profiles}
        self.open_nodes = open_nodes
        self.avoid = avoid
        self.placements = placements
        self.on_node: dict[str, Counter[str]] = {}
        self.gpus: Counter[str] = Counter()
        self.memory: Counter[str] = Counter()
        for p in placements:
            self.on_node.setdefault(p.model, Counter()).update(p.nodes)
            for name in p.nodes:
                self.gpus[name] += p.gpus_per_node
                self.memory[name] += p.memory_gb_per_node

    def admits(self, model: str, profile: PlacementProfile, names: Sequence[str]) -> bool:
        for name in names:
            node = self.inventory[name]
            if (
                name not in self.open_nodes
                or name in self.avoid.get(model, ())
                or (profile.gpu_class is not None and node.gpu_class != profile.gpu_class)
                or any(node.labels.get(k) != v for k, v in profile.node_selector.items())
            ):
                return False
        return True

    def room(self, a: Placement, profile: PlacementProfile) -> bool:
        """Free nodes holding none of ``a``'s model that could take it, spread no worse."""
        counts = self.on_node[a.model]
        names = []
        for name, node in sorted(self.inventory.items()):
            gpus = node.gpus - node.gpus_reserved - self.gpus[name]
            memory = None if node.memory_gb is None else node.memory_gb - self.memory[name]
            if (
                counts[name] == 0
                and (profile.gpus_per_node == 0 or gpus >= profile.gpus_per_node)
                and (
                    profile.min_memory_gb <= 0 or memory is None or memory >= profile.min_memory_gb
                )
                and self.admits(a.model, profile, (name,))
            ):
                names.append(name)
        if len(a.nodes) > 1:
            fabrics = Counter(f for n in names if (f := self.inventory[n].fabric) is not None)
            return any(c >= len(a.nodes) for c in fabrics.values())
        return any(self.no_worse({(a.model, a.replica): (name,)}, [a.model]) for name in names)

    def swappable(self, a: Placement, profile: PlacementProfile, b: Placement) -> bool:
        """Whether ``a`` and ``b`` could trade nodes: ``a``'s model leaves the shared node
        and no model's spread gets worse."""
        if (
            b.model == a.model
            # Partners of one priority: a swap then gives no unplaced replica new victims.
            or self.rules[b.model].priority != self.rules[a.model].priority
            or (len(b.nodes) > 1 and self.rules[b.model].spread_required)
            or set(a.nodes) & set(b.nodes)
            or any(self.on_node[a.model][name] for name in b.nodes)
            or any(self.on_node[b.model][name] for name in a.nodes)
        ):
            return False
        other = self.profiles.get((b.model, b.profile))
        return (
            other is not None
            and self.admits(a.model, profile, b.nodes)
            and self.admits(b.model, other, a.nodes)
            and self.no_worse(
                {(a.model, a.replica): b.nodes, (b.model, b.replica): a.nodes}, [a.model, b.model]
            )
        )

    def no_worse(
        self, moved: Mapping[tuple[str, int], tuple[str, ...]], models: Sequence[str]
    ) -> bool:
        """Whether moving replicas as ``moved`` says leaves each model's spread over its
        ``spread_by`` label no less even."""
        return all(self._label_score(m, moved) <= self._label_score(m, {}) for m in models)

    def _label_score(
        self, model: str, moved: Mapping[tuple[str, int], tuple[str, ...]]
    ) -> tuple[int, int]:
        label = self.rules[model].spread_by
        if label is None:
            return 0, 0
        unlabelled = 0
        values: Counter[str] = Counter()
        for p in self.placements:
            if p.model != model:
                continue
            names = moved.get((p.model, p.replica), p.nodes)
            found = {self.inventory[n].labels.get(label) for n in names}
            unlabelled += sum(label not in self.inventory[n].labels for n in names)
            values.update(v for v in found if v is not None)
        return unlabelled, sum(c * c for c in values.values())


def _shape(p: Placement) -> tuple[object, ...]:
    return p.gpu_class, p.gpus_per_node, p.memory_gb_per_node, len(p.nodes)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.placement.spreadcheck [NODES ...]``: the spread of ``plan()`` from
    nothing on the synthetic fleets of ``bench.placement.fleets``, for the ``scheduler``
    first on the path (run it from another tree's directory, with this one on
    ``PYTHONPATH``, for a before)."""
    import argparse
    import sys

    import scheduler
    from bench.placement import fleets
    from scheduler.planner.plan import plan

    parser = argparse.ArgumentParser(
        prog="python -m bench.placement.spreadcheck", description=main.__doc__
    )
    parser.add_argument("nodes", nargs="*", type=int, help="fleet sizes (5,000 and 10,000)")
    sizes = parser.parse_args(sys.argv[1:] if argv is None else argv).nodes or [5_000, 10_000]
    print(f"scheduler: {scheduler.__file__}")
    for size in sizes:
        nodes = fleets.synthetic_nodes(size)
        demands = fleets.synthetic_demands(2 * size)
        result = plan(demands, nodes, (), fleets.NOW)
        fresh = {n.name for n in nodes if fleets.NOW - n.reported_at <= timedelta(seconds=90)}
        found = check(
            demands,
            nodes,
            result.placements,
            result.place,
            fresh,
            unplaced={u.model for u in result.unplaced},
        )
        gpus = sum(p.gpus_per_node * len(p.nodes) for p in result.placements)
        print(
            f"synthetic {size:,}: won by {result.strategy}, {gpus:,} GPUs; models co-located "
            f"{len(found.colocated)}, while a distinct node existed {len(found.faults)} "
            f"(room {len(found.by_room)}, swap {len(found.by_swap)})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
