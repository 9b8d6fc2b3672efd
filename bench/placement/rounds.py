"""Placement: one round of ``scheduler.planner.plan.plan`` on real and synthetic fleets.

Speed: time per round from nothing placed, replicas placed per second, and a
round with nothing changed (the previous plan's placements as ``current``).
Quality: GPUs and replicas placed, against a first-fit baseline run on the
same inputs (``bench.placement.firstfit``) and against an upper bound (``gpu_bound``).

The real inventory is the Alibaba openb node list in ``tests/data`` (1,213
nodes, seven GPU classes, 1 to 8 cards each; no labels and no fabrics, so no
multi-node profiles there). The demand asks for more GPUs than the fleet has,
in mixed sizes, so that packing matters: a careless planner strands cards.
The synthetic fleets add labels, memory (some unknown), fabrics for
multi-node replicas, CPU nodes and a few stale nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from bench.placement import firstfit, spreadcheck
from bench.placement.fleets import (
    NOW,
    openb_demands,
    openb_nodes,
    openb_pod_demands,
    synthetic_demands,
    synthetic_nodes,
)
from bench.shared import common
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement, Plan
from scheduler.planner.plan import plan

# -- quality ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Quality:
    replicas: int
    gpus: int


def quality(placements: Sequence[Placement]) -> Quality:
    return Quality(len(placements), sum(p.gpus_per_node * len(p.nodes) for p in placements))


def stranded(
    placements: Sequence[Placement], demands: Sequence[Demand], nodes: Sequence[Node]
) -> int:
    """Free cards left on fresh nodes that a replica left unplaced could have asked for.

    A node counts when one of the GPU profiles of a model with an unplaced
    replica names its class and finds every selector label on it: those cards
    were wanted and idle, stranded by how earlier replicas were packed (or too
    few to hold one replica). Zero means nothing better was possible with the
    replicas placed where the profiles' priorities sent them.
    """
    placed: dict[str, int] = {}
    used: dict[str, int] = {}
    for p in placements:
        placed[p.model] = placed.get(p.model, 0) + 1
        for name in p.nodes:
            used[name] = used.get(name, 0) + p.gpus_per_node
    wanted = [
        prof
        for d in demands
        if placed.get(d.model, 0) < max(d.replicas, 0)
        for prof in d.profiles
        if prof.gpu_class is not None
    ]
    total = 0
    for n in nodes:
        if NOW - n.reported_at > timedelta(seconds=90) or n.gpu_class is None:
            continue
        free = n.gpus - n.gpus_reserved - used.get(n.name, 0)
        if free > 0 and any(
            prof.gpu_class == n.gpu_class
            and all(n.labels.get(k) == v for k, v in prof.node_selector.items())
            for prof in wanted
        ):
            total += free
    return total


def gpu_bound(demands: Sequence[Demand], nodes: Sequence[Node]) -> int:
    """An upper bound on the GPUs any planner can place: per-class capacity, as a max flow.

    Source -> model (capacity: its replicas x the most cards any of its profiles
    takes), model -> GPU class (for each class one of its profiles names, capacity:
    the free cards of the fresh nodes of that class with at least as many free
    cards as the model's smallest profile there needs; no replica of it fits on
    the others), class -> sink (capacity: the free cards of the class). Every
    real set of placements is a flow within these capacities, so the max flow
    bounds it from above. It ignores labels, memory and fabrics (which only
    shrink what fits) and how cards split within a node (which only strands some).
    """
    fresh = [n for n in nodes if NOW - n.reported_at <= timedelta(seconds=90) and n.gpu_class]
    free = {n.name: n.gpus - n.gpus_reserved for n in fresh}
    class_cap: dict[str, int] = {}
    for n in fresh:
        class_cap[n.gpu_class or ""] = class_cap.get(n.gpu_class or "", 0) + max(free[n.name], 0)
    graph = _Flow()
    # Models with the same classes and smallest sizes are one vertex (their
    # source capacities added, each class edge as large as the class): the
    # flow can only grow, so it stays a bound, and the 7,064 one-replica
    # models of the openb pod list become a handful of vertices.
    groups: dict[tuple[tuple[str, int], ...], int] = {}
    for d in demands:
        gpu_profiles = [p for p in d.profiles if p.gpu_class is not None]
        if not gpu_profiles:
            continue
        most = max(p.gpus_per_node * p.nodes for p in gpu_profiles)
        smallest: dict[str, int] = {}
        for p in gpu_profiles:
            cls = p.gpu_class or ""
            smallest[cls] = min(smallest.get(cls, p.gpus_per_node), p.gpus_per_node)
        shape = tuple(sorted(smallest.items()))
        groups[shape] = groups.get(shape, 0) + max(d.replicas, 0) * most
    for i, (shape, wanted) in enumerate(groups.items()):
        graph.edge("s", f"m:{i}", wanted)
        for cls, g in shape:
            usable = sum(free[n.name] for n in fresh if n.gpu_class == cls and free[n.name] >= g)
            graph.edge(f"m:{i}", f"c:{cls}", usable)
    for cls, cap in class_cap.items():
        graph.edge(f"c:{cls}", "t", cap)
    return graph.max_flow("s", "t")


class _Flow:
    """Edmonds-Karp on a small graph (a few hundred models, a handful of classes)."""

    def __init__(self) -> None:
        self.cap: dict[str, dict[str, int]] = {}

    def edge(self, a: str, b: str, capacity: int) -> None:
        self.cap.setdefault(a, {})
        self.cap.setdefault(b, {})
        self.cap[a][b] = self.cap[a].get(b, 0) + capacity
        self.cap[b].setdefault(a, 0)

    def max_flow(self, s: str, t: str) -> int:
        total = 0
        while True:
            parent = {s: s}
            queue = [s]
            for node in queue:
                for nxt, c in self.cap[node].items():
                    if c > 0 and nxt not in parent:
                        parent[nxt] = node
                        queue.append(nxt)
            if t not in parent:
                return total
            path = []
            node = t
            while node != s:
                path.append((parent[node], node))
                node = parent[node]
            push = min(self.cap[a][b] for a, b in path)
            for a, b in path:
                self.cap[a][b] -= push
                self.cap[b][a] += push
            total += push


def _unspread(result: Plan, demands: Sequence[Demand], nodes: Sequence[Node]) -> frozenset[str]:
    fresh = {n.name for n in nodes if NOW - n.reported_at <= timedelta(seconds=90)}
    waiting = {u.model for u in result.unplaced}
    return spreadcheck.check(
        demands, nodes, result.placements, result.place, fresh, unplaced=waiting
    ).faults


# -- measuring -----------------------------------------------------------------------------


def _round(
    demands: Sequence[Demand], nodes: Sequence[Node], repeats: int
) -> tuple[float, float, Plan]:
    """Best seconds of a round from scratch and of one with nothing changed, and the first
    plan. (A round planned from its changes, as the daemon runs it: ``python -m
    bench.placement.round_scale``.)"""
    first = plan(demands, nodes, (), NOW)
    current = first.placements
    again = plan(demands, nodes, current, NOW)
    if again.changes_anything:
        raise AssertionError("a round with nothing changed changed something")
    t_fresh, t_same = common.best_of(
        repeats,
        lambda: plan(demands, nodes, (), NOW),
        lambda: plan(demands, nodes, current, NOW),
    )
    return t_fresh, t_same, first


def run(quick: bool) -> list[common.Table]:
    speed = common.Table(
        "Placement: one round of `plan()`",
        [
            "fleet",
            "nodes",
            "replicas asked",
            "unplaced",
            "round",
            "replicas/s",
            "nothing changed",
        ],
    )
    quality_table = common.Table(
        "Placement quality: placed by `plan()`, by first fit, and the upper bound",
        [
            "fleet",
            "GPUs asked",
            "bound",
            "plan GPUs",
            "first-fit GPUs",
            "best-fit GPUs",
            "plan / ff / bf of bound",
            "plan won by",
            "stranded (plan)",
            "stranded (ff)",
            "plan replicas",
            "ff replicas",
            "bf replicas",
            "unspread models",
        ],
    )
    openb = openb_nodes()
    fleets: list[tuple[str, list[Node], list[Demand]]] = [
        ("openb (real)", openb, openb_demands()),
        ("openb pods (real)", openb, openb_pod_demands(openb)),
    ]
    sizes = (1_000, 2_000) if quick else (1_000, 2_000, 5_000, 10_000)
    for size in sizes:
        fleets.append((f"synthetic {size:,}", synthetic_nodes(size), synthetic_demands(2 * size)))
    for label, nodes, demands in fleets:
        asked = sum(max(d.replicas, 0) for d in demands)
        common.progress(f"placement: {label}, {len(nodes):,} nodes, {asked:,} replicas")
        t_fresh, t_same, result = _round(demands, nodes, repeats=3)
        ours = quality(result.placements)
        speed.add(
            label,
            f"{len(nodes):,}",
            f"{asked:,}",
            f"{len(result.unplaced):,}",
            common.ms(t_fresh),
            common.rate(ours.replicas, t_fresh),
            common.ms(t_same),
        )
        ff_placements = firstfit.place(demands, nodes, NOW)
        ff = quality(ff_placements)
        bf = quality(firstfit.best_fit(demands, nodes, NOW))
        if ours.gpus < max(ff.gpus, bf.gpus):
            raise AssertionError(f"{label}: the plan placed fewer GPUs than a baseline")
        bound = gpu_bound(demands, nodes)
        gpus_asked = sum(
            max(d.replicas, 0) * max((p.gpus_per_node * p.nodes for p in d.profiles), default=0)
            for d in demands
        )
        quality_table.add(
            label,
            f"{gpus_asked:,}",
            f"{bound:,}",
            f"{ours.gpus:,}",
            f"{ff.gpus:,}",
            f"{bf.gpus:,}",
            " / ".join(f"{q.gpus / bound:.4f}" for q in (ours, ff, bf)) if bound else "-",
            result.strategy,
            f"{stranded(result.placements, demands, nodes):,}",
            f"{stranded(ff_placements, demands, nodes):,}",
            f"{ours.replicas:,}",
            f"{ff.replicas:,}",
            f"{bf.replicas:,}",
            f"{len(_unspread(result, demands, nodes)):,}",
        )
    speed.note(
        "round: `plan(demands, nodes, current=(), now)`, nothing placed yet; nothing changed: "
        "the same inputs with the first round's placements as `current` (it must keep them "
        "all and change nothing, which is checked); best of 3, interleaved"
    )
    speed.note(
        "synthetic fleets: 2 replicas asked per node; 10% CPU nodes, five GPU classes, zones "
        "and pools, 5% unknown memory, 16-node fabrics, 1% stale nodes (bench/placement/rounds.py)"
    )
    quality_table.note(
        "stranded: free cards left on fresh nodes of a class (and labels) that a model with an "
        "unplaced replica names in one of its profiles: wanted and idle; 0 means every card "
        "a waiting replica could use is in use"
    )
    quality_table.note(
        "GPUs asked: each replica at its largest profile; bound: max-flow relaxation per GPU "
        "class (every placement fits within it; see `gpu_bound`); first fit: the same fit "
        "rules, replicas in the same order, profiles by priority, the first node by name "
        "that fits (bench/placement/firstfit.py); best fit: the same, on the best-fitting "
        "node (the "
        "planner before placement policy, `firstfit.best_fit`)"
    )
    quality_table.note(
        "plan won by: `policy` when the planner's own order (priority, largest replicas "
        "first) with spread placed the most GPUs; `best fit` / `first fit` when that "
        "baseline, run by the round itself on the same free capacity, placed more "
        "(scheduler/planner/packing.py); the run fails if the plan ever places fewer GPUs "
        "than either"
    )
    quality_table.note(
        "unspread models: models with a new replica sharing a node with another of theirs "
        "while a distinct fitting node existed (free room, or a same-shape new replica of "
        "another model to swap with; bench/placement/spreadcheck.py); the spread repair "
        "(scheduler/planner/spread_repair.py) runs whichever way won, so this is 0"
    )
    quality_table.note(
        "openb pods: the trace's 7,064 GPU pods (tests/data/openb_pod_list_gpu.csv, from "
        "`openb_pod_list_default.csv`) as one-replica models, any GPU class, a fraction "
        "of a card counted as a whole one, memory as asked"
    )
    return [speed, quality_table]
