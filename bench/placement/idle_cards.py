"""Does any packing use the cards the planner leaves idle? Settled by showing one.

``python -m bench.placement.idle_cards [--sizes 10,100,1000,5000,10000]``

Per fleet, one round from nothing: the planner's plan, then ``scheduler.exact.fill``
(per-node swaps, each an exact knapsack of cards and memory over the node's own
replicas and the unplaced ones, taken only when the node gains a card), then
``scheduler.exact.fill.problems`` checks the result from scratch (each replica once,
on one of its profiles, each node's cards and memory within what it has). The ceiling
is the cards of the fresh nodes (less reserved ones): no packing places more. When the
checked packing reaches it, the optimum is proven and the planner's distance to it is
exact; otherwise the packing is only a lower bound (CP-SAT's ``bench.placement.exact`` bound,
or the card count, is the ceiling).

Deterministic: the nodes in name order, CP-SAT on one worker with a fixed work limit
and seed per node. Cost: the swaps' CPU time is printed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from bench.placement.fleets import (
    NOW,
    openb_demands,
    openb_nodes,
    openb_pod_demands,
    spot_demands,
    spot_nodes,
    synthetic_demands,
    synthetic_nodes,
)
from bench.shared import common
from scheduler.exact.bound import gpu_bound
from scheduler.exact.fill import fill_idle, problems
from scheduler.exact.score import score
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement
from scheduler.planner.plan import plan


def run(sizes: Sequence[int]) -> common.Table:
    table = common.Table(
        "Idle cards: proven ceilings of the GPUs placed, the planner, and the planner's plan "
        "with per-node swaps (one round from nothing)",
        [
            "fleet",
            "cards",
            "per-node ceiling",
            "node-type bound",
            "planner GPUs",
            "swaps",
            "swapped GPUs",
            "checked",
            "proven optimum",
            "planner / optimum",
            "planner replicas",
            "swapped replicas",
            "bound CPU",
            "swaps CPU",
        ],
    )
    openb = openb_nodes()
    fleets: list[tuple[str, list[Node], list[Demand]]] = [
        ("openb", openb, openb_demands()),
        ("openb pods", openb, openb_pod_demands(openb)),
        ("spot (HP demand)", spot_nodes(), spot_demands()),
    ]
    fleets += [(f"synthetic {n:,}", synthetic_nodes(n), synthetic_demands(2 * n)) for n in sizes]
    for label, nodes, demands in fleets:
        common.progress(f"idle_cards: {label}")
        started = time.process_time()
        bound = gpu_bound(demands, nodes, NOW)
        bound_cpu = time.process_time() - started
        result = plan(demands, nodes, (), NOW)
        ours = score(demands, result.placements)
        started = time.process_time()
        filled = fill_idle(demands, nodes, result.placements, NOW)
        swaps_cpu = time.process_time() - started
        wrong = problems(demands, nodes, filled.placements, NOW)
        theirs = score(demands, filled.placements)
        best = max(ours.gpus, theirs.gpus) if not wrong else ours.gpus
        # Proven when a checked packing reaches the ceiling: nothing places more.
        proven = best == bound.gpus
        table.add(
            label,
            f"{bound.cards:,}",
            f"{bound.per_node:,}",
            f"{bound.gpus:,} ({bound.status})",
            f"{ours.gpus:,}",
            len(filled.swaps),
            f"{theirs.gpus:,}",
            "valid" if not wrong else f"{len(wrong)} problems",
            f"{best:,}" if proven else f"{best:,} to {bound.gpus:,}",
            f"{ours.gpus / best:.4f}" if proven else f">= {ours.gpus / bound.gpus:.4f}",
            f"{ours.replicas:,}",
            f"{theirs.replicas:,}",
            common.ms(bound_cpu),
            common.ms(swaps_cpu),
        )
        for swap in filled.swaps:
            common.progress(
                f"idle_cards: {label}: {swap.node} +{swap.gained}: out "
                f"{_shapes(swap.out)}, in {_shapes(swap.into)}"
            )
    table.note(
        "cards: usable cards of the fresh nodes; per-node ceiling: the most cards each node "
        "can carry with the shapes (cards, memory) that fit it, summed; node-type bound: "
        "scheduler.exact.bound.gpu_bound (identical nodes as one type, CP-SAT one worker, "
        "work 10, seed 0): no round places more GPUs"
    )
    table.note(
        "swaps: scheduler.exact.fill.fill_idle on the planner's plan, one node at a time by "
        "name; checked: scheduler.exact.fill.problems, from scratch. Proven optimum: a checked "
        "packing (the planner's or the swapped one) reaching the bound"
    )
    return table


def _shapes(placements: Sequence[Placement]) -> str:
    return "[" + ", ".join(f"{p.gpus_per_node}x{p.memory_gb_per_node}GB" for p in placements) + "]"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.placement.idle_cards", description=__doc__
    )
    parser.add_argument("--sizes", default="10,100,1000,5000,10000", help="synthetic fleet sizes")
    args = parser.parse_args(argv)
    print(run([int(s) for s in args.sizes.split(",") if s]).render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
