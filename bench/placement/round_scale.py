"""``python -m bench.placement.round_scale --nodes N``: the planner's round at a fleet's size.

One synthetic fleet (``fleets.synthetic_nodes``) of N nodes asking twice as many replicas
(``fleets.synthetic_demands``): the CPU of a round from nothing, of the round after it with
nothing changed, and of one after a node hosting a replica is lost, as one JSON object.
``bench.api.heartbeats`` runs it (in a process of its own) for its round figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

from bench.placement.fleets import NOW, synthetic_demands, synthetic_nodes
from scheduler.planner.plan import plan


def measure(nodes: int) -> dict[str, float]:
    fleet, demands = synthetic_nodes(nodes), synthetic_demands(2 * nodes)
    began = time.process_time()
    first = plan(demands, fleet, (), NOW)
    fresh = time.process_time() - began
    current = first.placements
    began = time.process_time()
    plan(demands, fleet, current, NOW)
    idle = time.process_time() - began
    host = current[0].nodes[0]
    lost = [replace(n, reported_at=NOW - timedelta(days=1)) if n.name == host else n for n in fleet]
    began = time.process_time()
    plan(demands, lost, current, NOW)
    change = time.process_time() - began
    return {
        "plan_fresh_cpu_ms": round(fresh * 1000, 1),
        "plan_idle_cpu_ms": round(idle * 1000, 1),
        "plan_change_cpu_ms": round(change * 1000, 1),
        "replicas": len(current),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.placement.round_scale")
    parser.add_argument("--nodes", type=int, default=10_000)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.nodes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
