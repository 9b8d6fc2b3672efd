"""How far a heuristic round is from the best possible one: the planner against CP-SAT.

``python -m bench.placement.exact [--work SECONDS] [--sizes 10,100,...]``

Per fleet, one round from nothing placed: the planner (``scheduler.planner.plan``)
and the exact program (``scheduler.exact.program``), both counted by
``scheduler.exact.score`` in the planner's own order: per priority tier GPUs
placed, then replicas placed, then moves, then spread (spread is left out of the
program here, it only ranks equal counts). GPUs first is also the openb question:
does any packing of cards and memory together use the cards the planner leaves
idle? CP-SAT starts from the planner's plan as a hint, runs on one worker for a
fixed deterministic work limit, and says whether its answer is ``optimal`` (proven)
or only ``feasible`` (the limit stopped it; the ratio is then also given against
its proven bound, which is a ceiling no planner can beat).

The fleets are those of ``bench.placement.rounds`` (``bench.placement.fleets``): openb with its
synthetic demand, openb with the trace's own pods, the spot-GPU trace's 4,278 nodes
with an HP demand made up in its spirit (``bench.placement.fleets.spot_demands``; host and some
GPU memory assumed, ``bench.placement.spot``), and synthetic fleets with twice as many replicas
asked as nodes.
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
from scheduler.exact.program import solve
from scheduler.exact.score import score
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand
from scheduler.planner.plan import plan


def _ratio(ours: int, best: int | None) -> str:
    if not best:
        return "-"
    return f"{ours / best:.4f}"


def run(work: float, sizes: Sequence[int], pods: bool, spot: bool = True) -> common.Table:
    table = common.Table(
        "Placement against the exact optimum: the planner / CP-SAT, one round from nothing, "
        "in the planner's order (GPUs, then replicas)",
        [
            "fleet",
            "nodes",
            "asked",
            "planner GPUs",
            "CP-SAT GPUs",
            "status",
            "proven GPU bound",
            "GPUs: planner / CP-SAT",
            "GPUs: planner / bound",
            "planner replicas",
            "CP-SAT replicas",
            "replicas: planner / CP-SAT",
            "planner CPU",
            "CP-SAT wall",
        ],
    )
    openb = openb_nodes()
    fleets: list[tuple[str, list[Node], list[Demand]]] = [("openb", openb, openb_demands())]
    if pods:
        fleets.append(("openb pods", openb, openb_pod_demands(openb)))
    if spot:
        fleets.append(("spot (HP demand)", spot_nodes(), spot_demands()))
    fleets += [(f"synthetic {n:,}", synthetic_nodes(n), synthetic_demands(2 * n)) for n in sizes]
    for label, nodes, demands in fleets:
        asked = sum(max(d.replicas, 0) for d in demands)
        common.progress(f"exact: {label}, {len(nodes):,} nodes, {asked:,} replicas")
        started = time.process_time()
        result = plan(demands, nodes, (), NOW)
        cpu = time.process_time() - started
        ours = score(demands, result.placements)
        answer = solve(demands, nodes, (), NOW, work=work, spread=False, hint=result.placements)
        best = answer.score
        common.progress(
            f"exact: {label}: planner {ours.gpus:,} GPUs / {ours.replicas:,} replicas, CP-SAT "
            f"{best and best.gpus} / {best and best.replicas} ({answer.status}), "
            f"GPU bound {answer.gpus_bound}"
        )
        table.add(
            label,
            f"{len(nodes):,}",
            f"{asked:,}",
            f"{ours.gpus:,}",
            "-" if best is None else f"{best.gpus:,}",
            answer.status,
            "-" if answer.gpus_bound is None else f"{answer.gpus_bound:,}",
            _ratio(ours.gpus, best.gpus if best else None),
            _ratio(ours.gpus, answer.gpus_bound),
            f"{ours.replicas:,}",
            "-" if best is None else f"{best.replicas:,}",
            _ratio(ours.replicas, best.replicas if best else None),
            common.ms(cpu),
            f"{answer.wall_seconds:.1f} s",
        )
    table.note(
        f"CP-SAT: one worker, max_deterministic_time {work:g}, seed 0, the planner's plan "
        "as a hint; `optimal` is proven, `feasible` means the work limit stopped it (the "
        "bound is then CP-SAT's proven ceiling of the GPUs placed, which no planner can beat)"
    )
    table.note(
        "objective (scheduler.exact.score, Score.key): per priority tier GPUs placed, then "
        "replicas placed, then moves (0 from nothing), spread left out of the program; one "
        "tier in these fleets. The program leaves out required spread and label domains, "
        "which can only make its optimum larger"
    )
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.placement.exact", description=__doc__)
    parser.add_argument("--work", type=float, default=10.0, help="deterministic seconds")
    parser.add_argument("--sizes", default="10,100,1000,5000", help="synthetic fleet sizes")
    parser.add_argument("--no-pods", action="store_true", help="skip the openb pod list")
    parser.add_argument("--no-spot", action="store_true", help="skip the spot-GPU inventory")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print(run(args.work, sizes, not args.no_pods, not args.no_spot).render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
