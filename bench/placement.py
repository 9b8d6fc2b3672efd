"""Placement: one round of ``scheduler.planner.plan.plan`` on real and synthetic fleets.

Speed: time per round from nothing placed, replicas placed per second, and a
round with nothing changed (the previous plan's placements as ``current``).
Quality: GPUs and replicas placed, against a first-fit baseline run on the
same inputs (``bench.firstfit``) and against an upper bound (``gpu_bound``).

The real inventory is the Alibaba openb node list in ``tests/data`` (1,213
nodes, seven GPU classes, 1 to 8 cards each; no labels and no fabrics, so no
multi-node profiles there). The demand asks for more GPUs than the fleet has,
in mixed sizes, so that packing matters: a careless planner strands cards.
The synthetic fleets add labels, memory (some unknown), fabrics for
multi-node replicas, CPU nodes and a few stale nodes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from bench import common, firstfit, spreadcheck
from bench.openb import load_openb_csv, load_openb_pods_csv
from catalog.views import PlacementProfile
from scheduler.planner.inventory import Node
from scheduler.planner.placements import Demand, Placement, Plan
from scheduler.planner.plan import plan

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
OPENB = common.REPO / "tests" / "data" / "openb_node_list_gpu_node.csv"
OPENB_PODS = common.REPO / "tests" / "data" / "openb_pod_list_gpu.csv"


def _gpu(
    name: str,
    cls: str,
    gpus: int,
    *,
    priority: int = 0,
    nodes: int = 1,
    memory: int = 0,
    selector: dict[str, str] | None = None,
) -> PlacementProfile:
    return PlacementProfile(
        name=name,
        engine="vllm",
        gpu_class=cls,
        gpus_per_node=gpus,
        nodes=nodes,
        priority=priority,
        node_selector=dict(selector or {}),
        min_memory_gb=memory,
    )


def _cpu(name: str, *, memory: int, selector: dict[str, str] | None = None) -> PlacementProfile:
    return PlacementProfile(
        name=name,
        engine="llamacpp",
        gpu_class=None,
        gpus_per_node=0,
        nodes=1,
        priority=0,
        node_selector=dict(selector or {}),
        min_memory_gb=memory,
    )


# -- the real inventory ---------------------------------------------------------------


def openb_nodes() -> list[Node]:
    return load_openb_csv(OPENB, reported_at=NOW)


def openb_pod_demands(nodes: Sequence[Node]) -> list[Demand]:
    """The trace's own 7,064 GPU pods (``openb_pod_list_default``), each a one-replica model
    that may run on any GPU class of the inventory: 7,433 GPUs asked of 6,212."""
    return load_openb_pods_csv(OPENB_PODS, sorted({n.gpu_class for n in nodes if n.gpu_class}))


def openb_demands() -> list[Demand]:
    """About 6,500 GPUs asked of a fleet of 6,212, in sizes of 1, 2, 4 and 8 cards."""
    return [
        Demand(
            "llama-3.1-70b",
            60,
            (_gpu("g2-tp8", "G2", 8, priority=10), _gpu("v100-tp8", "V100M32", 8, priority=5)),
        ),
        Demand(
            "qwen2.5-7b",
            400,
            (
                _gpu("t4-tp2", "T4", 2, priority=10),
                _gpu("p100-tp2", "P100", 2, priority=5),
                _gpu("g2-tp1", "G2", 1),
            ),
        ),
        Demand(
            "mixtral-8x7b",
            100,
            (
                _gpu("g2-tp4", "G2", 4, priority=10),
                _gpu("v100-tp4", "V100M16", 4, priority=5),
                _gpu("g3-tp4", "G3", 4),
            ),
        ),
        Demand(
            "bge-m3",
            900,
            (
                _gpu("t4", "T4", 1, priority=10),
                _gpu("p100", "P100", 1),
                _gpu("v100", "V100M16", 1),
                _gpu("a10", "A10", 1),
            ),
        ),
        Demand(
            "deepseek-v2-lite",
            200,
            (_gpu("g2-tp8", "G2", 8, priority=10), _gpu("g3-tp8", "G3", 8, priority=5)),
        ),
        Demand("phi-3-mini", 1500, (_gpu("g2-tp1", "G2", 1, priority=10), _gpu("t4-tp1", "T4", 1))),
        Demand(
            "llama-3.1-8b",
            400,
            (_gpu("g2-tp2", "G2", 2, priority=10), _gpu("v100-tp2", "V100M32", 2)),
        ),
    ]


# -- synthetic fleets -------------------------------------------------------------------

_CLASSES = (  # class, cards per node, share of GPU nodes
    ("H100", 8, 0.15),
    ("A100", 8, 0.25),
    ("L40S", 4, 0.2),
    ("L4", 2, 0.2),
    ("T4", 1, 0.2),
)


def synthetic_nodes(count: int, seed: int = 7) -> list[Node]:
    """GPU nodes of five classes (10% CPU-only), zones, pools, memory (5% unknown), fabrics
    of 16 nodes for the 8-card classes, a few cards reserved and 1% of nodes stale."""
    rng = random.Random(seed)
    nodes = []
    for i in range(count):
        name = f"node-{i:05d}"
        labels = {"zone": rng.choice(["eu", "us", "ap"]), "pool": rng.choice(["prod", "batch"])}
        memory = None if rng.random() < 0.05 else float(rng.choice([128, 256, 512, 1024]))
        silent = timedelta(seconds=200) if rng.random() < 0.01 else timedelta(0)
        if rng.random() < 0.1:
            labels["pool"] = "cpu"
            nodes.append(Node(name, None, 0, memory, NOW - silent, labels))
            continue
        roll, acc = rng.random(), 0.0
        cls, cards = _CLASSES[-1][:2]
        for c, n, share in _CLASSES:
            acc += share
            if roll < acc:
                cls, cards = c, n
                break
        fabric = f"{cls}-fab-{i // 16}" if cards == 8 else None
        reserved = 1 if rng.random() < 0.03 and cards > 1 else 0
        nodes.append(Node(name, cls, cards, memory, NOW - silent, labels, fabric, reserved))
    return nodes


def synthetic_demands(replicas: int, seed: int = 11) -> list[Demand]:
    """Models of every shape summing to ``replicas`` replicas: 1-8 cards, two-node gangs,
    selectors, memory needs, CPU profiles, two or three profiles each."""
    rng = random.Random(seed)
    shapes: list[tuple[PlacementProfile, ...]] = [
        (_gpu("h100-tp8", "H100", 8, priority=10), _gpu("a100-tp8", "A100", 8, priority=5)),
        (_gpu("h100-2x8", "H100", 8, nodes=2, priority=10), _gpu("a100-2x8", "A100", 8, nodes=2)),
        (_gpu("a100-tp4", "A100", 4, priority=10), _gpu("l40s-tp4", "L40S", 4, priority=5)),
        (
            _gpu("l40s-tp2", "L40S", 2, priority=10, selector={"zone": "eu"}),
            _gpu("l4-tp2", "L4", 2, priority=5, selector={"zone": "eu"}),
        ),
        (_gpu("l4-tp1", "L4", 1, priority=10, memory=64), _gpu("t4", "T4", 1, memory=32)),
        (
            _gpu("t4", "T4", 1, priority=10),
            _gpu("l4", "L4", 1, priority=5),
            _cpu("cpu", memory=16, selector={"pool": "cpu"}),
        ),
        (
            _gpu("a100-tp2", "A100", 2, priority=10, selector={"pool": "prod"}),
            _gpu("h100-tp2", "H100", 2, priority=5, selector={"pool": "prod"}),
        ),
        (_cpu("cpu-small", memory=8),),
    ]
    weights = [3, 1, 4, 6, 10, 12, 5, 4]
    demands = []
    left = replicas
    i = 0
    while left > 0:
        shape = rng.choices(shapes, weights)[0]
        count = min(left, rng.randint(5, 60))
        demands.append(Demand(f"model-{i:04d}", count, shape))
        left -= count
        i += 1
    return demands


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


def reported_again(nodes: Sequence[Node], seconds: int) -> list[Node]:
    """The inventory as the store reads it a round later: new objects, every report
    ``seconds`` newer, nothing else changed."""
    return [
        replace(n, labels=dict(n.labels), reported_at=n.reported_at + timedelta(seconds=seconds))
        for n in nodes
    ]


def _round(
    demands: Sequence[Demand], nodes: Sequence[Node], repeats: int
) -> tuple[float, float, float, Plan]:
    """Best seconds of a round from scratch, of one with nothing changed, of one whose
    inputs did not change (remembered by ``PlanMemo``), and the first plan."""
    first = plan(demands, nodes, (), NOW)
    current = first.placements
    again = plan(demands, nodes, current, NOW)
    if again.changes_anything:
        raise AssertionError("a round with nothing changed changed something")
    # Imported here: ``bench.ab`` runs this module's fleets against older trees without it.
    from scheduler.planner.plan_cache import PlanMemo

    memo = PlanMemo()
    first_memo = memo(demands, nodes, current, NOW)
    # Each remembered round gets inputs as a store would read them: fresh copies,
    # reported 10 s later, at a time 10 s later (same freshness, same plan). They
    # are made before the clock starts: reading them is the store's cost, not the round's.
    later = [
        (
            reported_again(nodes, 10 * i),
            [replace(p) for p in current],
            NOW + timedelta(seconds=10 * i),
        )
        for i in range(repeats, 0, -1)
    ]

    def remembered() -> Plan:
        again_nodes, again_current, again_now = later.pop()
        return memo(demands, again_nodes, again_current, again_now)

    t_fresh, t_same, t_memo = common.best_of(
        repeats,
        lambda: plan(demands, nodes, (), NOW),
        lambda: plan(demands, nodes, current, NOW),
        remembered,
    )
    if memo.hits != repeats or memo(demands, nodes, current, NOW) is not first_memo:
        raise AssertionError("a round whose inputs did not change was planned again")
    return t_fresh, t_same, t_memo, first


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
            "inputs unchanged (memo)",
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
        t_fresh, t_same, t_memo, result = _round(demands, nodes, repeats=3)
        ours = quality(result.placements)
        speed.add(
            label,
            f"{len(nodes):,}",
            f"{asked:,}",
            f"{len(result.unplaced):,}",
            common.ms(t_fresh),
            common.rate(ours.replicas, t_fresh),
            common.ms(t_same),
            common.ms(t_memo),
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
        "inputs unchanged (memo): the same round through "
        "`scheduler.planner.plan_cache.PlanMemo`, as the daemon runs it, with the inputs "
        "as a store reads them a round later (new objects, "
        "every node reported 10 s later, `now` 10 s later: the same freshness); it must "
        "return the remembered plan, which is checked; the goal of issue 13 is 'close to free'"
    )
    speed.note(
        "synthetic fleets: 2 replicas asked per node; 10% CPU nodes, five GPU classes, zones "
        "and pools, 5% unknown memory, 16-node fabrics, 1% stale nodes (bench/placement.py)"
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
        "that fits (bench/firstfit.py); best fit: the same, on the best-fitting node (the "
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
        "another model to swap with; bench/spreadcheck.py); the spread repair "
        "(scheduler/planner/spread_repair.py) runs whichever way won, so this is 0"
    )
    quality_table.note(
        "openb pods: the trace's 7,064 GPU pods (tests/data/openb_pod_list_gpu.csv, from "
        "`openb_pod_list_default.csv`) as one-replica models, any GPU class, a fraction "
        "of a card counted as a whole one, memory as asked"
    )
    return [speed, quality_table]
