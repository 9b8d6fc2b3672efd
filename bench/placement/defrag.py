"""Defragmentation's cost: one round of ``plan.plan`` with the step on and off (issue 29).

``python -m bench.placement.defrag [--quick] [--repeats N]`` prints a markdown table: CPU time
(``time.process_time``, best of N, on and off interleaved so that a loaded machine
weighs on both alike) per round, and what the round did.

Cases, 5,000 nodes (``--quick``: 500):

- ``synthetic``: the synthetic fleet and demands (``bench.placement.fleets``: 10,000 replicas of
  mixed sizes, labels, memory, fabrics, some stale nodes), from nothing and with nothing
  changed. Many replicas stay unplaced there (the demand exceeds the fleet), so the step
  searches every round: its worst everyday case.
- ``fragmented``: 8-card nodes, 10,000 one-card replicas spread two a node, then one
  tensor-parallel-8 replica: the round that plans its moves (two, on one node).
- ``fragmented, budget 1``: the same with the one-card model's
  ``disruption.max_unavailable: 1``: no node can be cleared, so every node is tried and
  the refusal names the budget (the search's worst case).
- ``fragmented ... gang``: the same nodes (fabrics of 16) with a gang of two 8-card
  nodes instead: four moves on two nodes of one fabric; with budget 3 no two nodes can
  be cleared, so every fabric is tried (the gang search's worst case).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.placement.fleets import NOW, synthetic_demands, synthetic_nodes
from catalog.definition.views import PlacementProfile
from scheduler.lifecycle.inputs import ModelLifecycle
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement, Plan
from scheduler.planner.plan import plan

ON = StalenessPolicy()
OFF = StalenessPolicy(defragment=False)


@dataclass(frozen=True)
class Case:
    label: str
    demands: Sequence[Demand]
    nodes: Sequence[Node]
    current: Sequence[Placement]


def _profile(name: str, gpus: int) -> PlacementProfile:
    return PlacementProfile(name, "vllm", "T4", gpus, 1, 0)


def _fragmented(size: int, budget: int | None, *, gang: bool = False) -> Case:
    # Fabrics of 16 nodes, as the synthetic fleet's (only a gang looks at them).
    nodes = [
        Node(f"n{i:05d}", "T4", 8, None, NOW, fabric=f"fab-{i // 16:04d}") for i in range(size)
    ]
    one = _profile("t4", 1)
    small = Demand(
        "small",
        2 * size,
        (one,),
        lifecycle=ModelLifecycle(fingerprints={"t4": "f"}, min_ready=0, max_moving=budget),
    )
    # Two a node, as spread leaves them.
    current = [Placement("small", r, "t4", (f"n{r % size:05d}",), 1, "T4") for r in range(2 * size)]
    wanted = PlacementProfile("t4x8x2", "vllm", "T4", 8, 2, 0) if gang else _profile("t4x8", 8)
    big = Demand("big", 1, (wanted,), lifecycle=ModelLifecycle())
    label = "fragmented" if budget is None else f"fragmented, budget {budget}"
    what = "1 gang of 2 x TP=8" if gang else "1 TP=8"
    return Case(f"{label}: {2 * size:,} one-card replicas + {what}", [small, big], nodes, current)


def cases(size: int) -> list[Case]:
    nodes = synthetic_nodes(size)
    demands = synthetic_demands(2 * size)
    first = plan(demands, nodes, (), NOW, OFF)
    return [
        Case(f"synthetic {size:,} nodes, {2 * size:,} replicas: from nothing", demands, nodes, ()),
        Case("synthetic: nothing changed", demands, nodes, first.placements),
        _fragmented(size, None),
        _fragmented(size, 1),
        _fragmented(size, None, gang=True),
        _fragmented(size, 3, gang=True),
    ]


def _cpu(fn: Callable[[], Plan]) -> tuple[float, Plan]:
    gc.collect()
    started = time.process_time()
    result = fn()
    return time.process_time() - started, result


def measure(case: Case, repeats: int) -> tuple[float, float, Plan, Plan]:
    def run(policy: StalenessPolicy) -> Callable[[], Plan]:
        return lambda: plan(case.demands, case.nodes, case.current, NOW, policy)

    best_on = best_off = float("inf")
    on = off = None
    for _ in range(repeats):
        t, off = _cpu(run(OFF))
        best_off = min(best_off, t)
        t, on = _cpu(run(ON))
        best_on = min(best_on, t)
    assert on is not None and off is not None
    return best_off, best_on, off, on


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.placement.defrag", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="500 nodes rather than 5,000")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per setting (best of)")
    args = parser.parse_args(argv)
    size = 500 if args.quick else 5_000
    print("| case | CPU off (s) | CPU on (s) | on / off | moves | unplaced off / on |")
    print("|---|---|---|---|---|---|")
    for case in cases(size):
        print(f"  {case.label} ...", file=sys.stderr)
        off_s, on_s, off, on = measure(case, args.repeats)
        print(
            f"| {case.label} | {off_s:.3f} | {on_s:.3f} | {on_s / off_s:.2f} | "
            f"{len(on.moves)} | {len(off.unplaced)} / {len(on.unplaced)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Case", "cases", "main", "measure"]
