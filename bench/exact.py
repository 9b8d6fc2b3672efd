"""How far a heuristic round is from the best possible one: the planner against CP-SAT.

``python -m bench.exact [--work SECONDS] [--sizes 10,100,...]``

Per fleet, one round from nothing placed: the planner (``scheduler.planner.plan``)
and the exact program (``scheduler.exact.program``), both counted by
``scheduler.exact.score``. Two objectives, each solved on its own: the planner's
(replicas placed per priority tier, then moves, then spread; spread is left out of
the program here, it only ranks equal counts) and GPUs placed (the openb question:
does any packing of cards and memory together use the cards the planner leaves
idle?). CP-SAT starts from the planner's plan as a hint, runs on one worker for a
fixed deterministic work limit, and says whether its answer is ``optimal`` (proven)
or only ``feasible`` (the limit stopped it; the ratio is then also given against
its proven bound, which is a ceiling no planner can beat).

The fleets are those of ``bench.placement`` (``bench.fleets``): openb with its
synthetic demand, openb with the trace's own pods, and synthetic fleets with twice
as many replicas asked as nodes. There is no spot inventory in the benches.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from bench import common
from bench.fleets import (
    NOW,
    openb_demands,
    openb_nodes,
    openb_pod_demands,
    synthetic_demands,
    synthetic_nodes,
)
from scheduler.exact.program import Answer, solve
from scheduler.exact.score import score
from scheduler.planner.inventory import Node
from scheduler.planner.placements import Demand
from scheduler.planner.plan import plan


def _ratio(ours: int, best: int | None) -> str:
    if not best:
        return "-"
    return f"{ours / best:.4f}"


def _found(answer: Answer, gpus: bool) -> int | None:
    if answer.score is None:
        return None
    return answer.score.gpus if gpus else answer.score.replicas


def run(work: float, sizes: Sequence[int], pods: bool) -> common.Table:
    table = common.Table(
        "Placement against the exact optimum: the planner / CP-SAT, one round from nothing",
        [
            "fleet",
            "nodes",
            "asked",
            "objective",
            "planner",
            "CP-SAT",
            "status",
            "proven bound",
            "planner / CP-SAT",
            "planner / bound",
            "planner CPU",
            "CP-SAT wall",
        ],
    )
    openb = openb_nodes()
    fleets: list[tuple[str, list[Node], list[Demand]]] = [("openb", openb, openb_demands())]
    if pods:
        fleets.append(("openb pods", openb, openb_pod_demands(openb)))
    fleets += [(f"synthetic {n:,}", synthetic_nodes(n), synthetic_demands(2 * n)) for n in sizes]
    for label, nodes, demands in fleets:
        asked = sum(max(d.replicas, 0) for d in demands)
        common.progress(f"exact: {label}, {len(nodes):,} nodes, {asked:,} replicas")
        started = time.process_time()
        result = plan(demands, nodes, (), NOW)
        cpu = time.process_time() - started
        ours = score(demands, result.placements)
        for gpus in (False, True):
            answer = solve(
                demands, nodes, (), NOW, work=work, spread=False, gpus=gpus, hint=result.placements
            )
            mine = ours.gpus if gpus else ours.replicas
            best = _found(answer, gpus)
            bound = answer.gpus_bound if gpus else answer.replicas_bound
            common.progress(
                f"exact: {label} {'GPUs' if gpus else 'replicas'}: planner {mine:,}, "
                f"CP-SAT {best} ({answer.status}), bound {bound}"
            )
            table.add(
                label,
                f"{len(nodes):,}",
                f"{asked:,}",
                "GPUs" if gpus else "replicas",
                f"{mine:,}",
                "-" if best is None else f"{best:,}",
                answer.status,
                "-" if bound is None else f"{bound:,}",
                _ratio(mine, best),
                _ratio(mine, bound),
                common.ms(cpu),
                f"{answer.wall_seconds:.1f} s",
            )
    table.note(
        f"CP-SAT: one worker, max_deterministic_time {work:g}, seed 0, the planner's plan "
        "as a hint; `optimal` is proven, `feasible` means the work limit stopped it (the "
        "bound is then CP-SAT's proven ceiling, the best it could still be)"
    )
    table.note(
        "replicas: the planner's objective (one priority tier in these fleets: replicas "
        "placed; spread left out of the program, moves are 0 from nothing); GPUs: cards "
        "placed, memory and fabrics included. The program leaves out required spread and "
        "label domains, which can only make its optimum larger"
    )
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.exact", description=__doc__)
    parser.add_argument("--work", type=float, default=10.0, help="deterministic seconds")
    parser.add_argument("--sizes", default="10,100,1000,5000", help="synthetic fleet sizes")
    parser.add_argument("--no-pods", action="store_true", help="skip the openb pod list")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print(run(args.work, sizes, not args.no_pods).render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
