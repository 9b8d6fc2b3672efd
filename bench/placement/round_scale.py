"""``python -m bench.placement.round_scale --nodes N [N ...]``: the planner's round by size.

One synthetic fleet (``fleets.synthetic_nodes``) of N nodes asking twice as many replicas
(``fleets.synthetic_demands``), planner CPU (``time.process_time``) of:

- a round from nothing (``plan_fresh_cpu_ms``);
- a round with nothing changed, two ways, alternated (best of ``--repeats``): planned in
  full (``plan_idle_cpu_ms``: ``plan()`` on the same inputs) and from its changes
  (``round_idle_cpu_ms``: ``IncrementalRounds.next`` told the nodes not fresh, 10 s later,
  as the daemon runs it);
- a round after a node hosting a replica is lost: in full (``plan_change_cpu_ms``) and
  from its changes (``round_change_cpu_ms``).

One size: one JSON object. Several: one object per size, then the growth exponent of
each figure between consecutive sizes and over the whole range (``log(t2/t1) /
log(n2/n1)``: 1 is linear; n log n is about 1.1 over 10,000-100,000).
``bench.api.heartbeats`` runs it (in a process of its own) for its round figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from functools import partial
from typing import Any

from bench.placement.fleets import NOW, synthetic_demands, synthetic_nodes
from scheduler.lifecycle.staleness import DEFAULT_STALENESS
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement
from scheduler.planner.plan import plan

FIGURES = (
    "plan_fresh_cpu_ms",
    "plan_idle_cpu_ms",
    "round_idle_cpu_ms",
    "plan_change_cpu_ms",
    "round_change_cpu_ms",
)


def _cpu(fn: Callable[[], Any]) -> float:
    began = time.process_time()
    fn()
    return (time.process_time() - began) * 1000


def _not_fresh(nodes: Sequence[Node], at: Any) -> dict[str, Any]:
    fresh_from = at - DEFAULT_STALENESS.stale_after
    return {n.name: n.reported_at for n in nodes if n.reported_at < fresh_from}


def _tiled(size: int, tiles: int) -> tuple[list[Node], list[Demand], tuple[Placement, ...]]:
    """``tiles`` copies of the synthetic fleet of ``size`` nodes (names, fabrics and models
    renamed per copy), each copy's replicas placed as the planner places them on one copy;
    then one round over the whole, so that the placements are the planner's own."""
    fleet, demands = synthetic_nodes(size), synthetic_demands(2 * size)
    placed = plan(demands, fleet, (), NOW).placements
    nodes: list[Node] = []
    asked: list[Demand] = []
    current: list[Placement] = []
    for t in range(tiles):
        nodes += [
            replace(
                n,
                name=f"t{t}-{n.name}",
                fabric=None if n.fabric is None else f"t{t}-{n.fabric}",
                labels=dict(n.labels),
            )
            for n in fleet
        ]
        asked += [replace(d, model=f"t{t}-{d.model}") for d in demands]
        current += [
            replace(p, model=f"t{t}-{p.model}", nodes=tuple(f"t{t}-{x}" for x in p.nodes))
            for p in placed
        ]
    settled = plan(asked, nodes, current, NOW).placements
    return nodes, asked, settled


def measure(nodes: int, repeats: int = 3, tiles: int = 1) -> dict[str, float | None]:
    # Imported here: older trees (``LLMGW_BENCH_BASE``) do not have it.
    from scheduler.planner.rounds.incremental import Changes, IncrementalRounds

    fresh: float | None = None
    if tiles > 1:
        fleet, demands, current = _tiled(nodes // tiles, tiles)
        nodes = len(fleet)
    else:
        fleet, demands = synthetic_nodes(nodes), synthetic_demands(2 * nodes)
        began = time.process_time()
        current = plan(demands, fleet, (), NOW).placements
        fresh = (time.process_time() - began) * 1000
    host = current[0].nodes[0]

    rounds = IncrementalRounds()
    rounds.start(demands, fleet, current, NOW)
    # The inputs of each later round, made before any clock starts (reading them is the
    # store's cost): only the nodes not fresh at its time, of every node as read again,
    # its lease 10 s newer.
    later = [NOW + timedelta(seconds=10 * (i + 1)) for i in range(repeats)]
    read_again = [
        [replace(n, labels=dict(n.labels), reported_at=n.reported_at + (at - NOW)) for n in fleet]
        for at in later
    ]
    stale_changes = [
        Changes(now=at, not_fresh=_not_fresh(again, at))
        for at, again in zip(later, read_again, strict=True)
    ]
    idle: dict[str, float] = dict.fromkeys(("plan", "round"), math.inf)
    for changes in stale_changes:
        idle["plan"] = min(idle["plan"], _cpu(lambda: plan(demands, fleet, current, NOW)))
        idle["round"] = min(idle["round"], _cpu(partial(rounds.next, changes)))
    if rounds.reused != repeats:
        raise AssertionError(
            f"a round with nothing changed was planned again (incremental rounds reused "
            f"{rounds.reused}, of {repeats})"
        )

    lost = [replace(n, reported_at=NOW - timedelta(days=1)) if n.name == host else n for n in fleet]
    change_plan = _cpu(lambda: plan(demands, lost, current, NOW))
    lost_at = later[-1] + timedelta(seconds=10)
    aged = [replace(n, reported_at=n.reported_at + (lost_at - NOW)) for n in fleet]
    gone = Changes(
        now=lost_at, not_fresh={**_not_fresh(aged, lost_at), host: NOW - timedelta(days=1)}
    )
    change_round = _cpu(lambda: rounds.next(gone))
    return {
        "nodes": nodes,
        "replicas": len(current),
        "plan_fresh_cpu_ms": None if fresh is None else round(fresh, 1),
        "plan_idle_cpu_ms": round(idle["plan"], 1),
        "round_idle_cpu_ms": round(idle["round"], 2),
        "plan_change_cpu_ms": round(change_plan, 1),
        "round_change_cpu_ms": round(change_round, 1),
    }


def exponents(results: Sequence[dict[str, float | None]]) -> dict[str, dict[str, float]]:
    """Each figure's growth exponent between consecutive sizes, and first to last."""
    out: dict[str, dict[str, float]] = {}
    pairs = [*itertools.pairwise(results)]
    if len(results) > 2:
        pairs.append((results[0], results[-1]))
    for a, b in pairs:
        na, nb = a["nodes"] or 1, b["nodes"] or 1
        ratio = math.log(nb / na)
        out[f"{int(na)}-{int(nb)}"] = {
            k: round(math.log(y / x) / ratio, 2)
            for k in FIGURES
            if (x := a[k]) is not None and (y := b[k]) is not None and x > 0 and y > 0
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.placement.round_scale")
    parser.add_argument("--nodes", type=int, nargs="+", default=[10_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--tiles",
        type=int,
        default=1,
        help="build each fleet as this many renamed copies of one N/tiles nodes, placed "
        "once (a round from nothing at 100,000 nodes takes minutes): no from-nothing figure",
    )
    args = parser.parse_args(argv)
    results = []
    for count in args.nodes:
        results.append(measure(count, args.repeats, args.tiles))
        if len(args.nodes) > 1:
            print(json.dumps(results[-1]), flush=True)
    if len(results) == 1:
        print(json.dumps(results[0]))
    else:
        print(json.dumps({"exponents": exponents(results)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
