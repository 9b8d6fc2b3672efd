"""The spread repair's partner index: one round with it and with the scan it replaced (issue 29).

``python -m bench.placement.spread_repair [--repeats N] [--sizes 5000]`` prints a markdown table:
CPU time (``time.process_time``, best of N, the two ways interleaved so that a loaded
machine weighs on both alike) of one ``plan.plan`` from nothing placed, with the
repair's swaps found through ``Group.partner_keys`` (``index``) and by scanning every
node of the candidate's shape (``scan``, the code before the index, still what
multi-node shapes and ``spread_by`` models use), and the two plans compared whole.

The scan is reached by giving the planner a ``repair`` with ``index_after=None``
(``scheduler.planner.plan`` looks ``repair`` up when it runs): a bench-only switch, the
planner itself has none.
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import scheduler.planner.plan as planner
from bench.placement.fleets import (
    NOW,
    openb_demands,
    openb_nodes,
    openb_pod_demands,
    synthetic_demands,
    synthetic_nodes,
)
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Plan
from scheduler.planner.spread_repair import repair


@contextmanager
def scanning() -> Iterator[None]:
    """Rounds planned inside use the scan rather than the partner index."""
    # ``plan`` imports ``repair`` for its own use and does not export it (hence the ignores).
    planner.repair = functools.partial(repair, index_after=None)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        planner.repair = repair  # type: ignore[attr-defined]


def _cpu(fn: Callable[[], Plan]) -> tuple[float, Plan]:
    gc.collect()
    started = time.process_time()
    result = fn()
    return time.process_time() - started, result


def measure(
    demands: Sequence[Demand], nodes: Sequence[Node], repeats: int
) -> tuple[float, float, Plan, Plan]:
    """Best CPU seconds of a round with the scan and with the index, and their plans."""

    def round_() -> Plan:
        return planner.plan(demands, nodes, (), NOW)

    best_scan = best_index = float("inf")
    scanned = indexed = None
    for _ in range(repeats):
        with scanning():
            t, scanned = _cpu(round_)
        best_scan = min(best_scan, t)
        t, indexed = _cpu(round_)
        best_index = min(best_index, t)
    assert scanned is not None and indexed is not None
    return best_scan, best_index, scanned, indexed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.placement.spread_repair", description=__doc__
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds per way (best of)")
    parser.add_argument(
        "--sizes", default="5000", help="synthetic fleet sizes, comma-separated ('' for none)"
    )
    args = parser.parse_args(argv)
    openb = openb_nodes()
    fleets: list[tuple[str, list[Node], list[Demand]]] = [
        ("openb (3,560 replicas)", openb, openb_demands()),
        ("openb pods (7,064)", openb, openb_pod_demands(openb)),
    ]
    for size in (int(s) for s in args.sizes.split(",") if s):
        fleets.append(
            (
                f"synthetic {size:,} ({2 * size:,})",
                synthetic_nodes(size),
                synthetic_demands(2 * size),
            )
        )
    print("| fleet | scan (s) | index (s) | index / scan | swaps + moves (notes) | same plan |")
    print("|---|---|---|---|---|---|")
    for label, nodes, demands in fleets:
        print(f"  {label} ...", file=sys.stderr)
        scan_s, index_s, scanned, indexed = measure(demands, nodes, args.repeats)
        same = scanned == indexed
        print(
            f"| {label} | {scan_s:.3f} | {index_s:.3f} | {index_s / scan_s:.2f} | "
            f"{len(indexed.notes)} | {'yes' if same else '**no**'} |"
        )
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main", "measure", "scanning"]
