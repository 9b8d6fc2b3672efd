"""``python -m bench.placement.round_reads --nodes N [--store S]``: what a round reads.

The planner's side of a round is ``bench.placement.round_scale``; this is the store's. A
database (a scratch SQLite file, or a fresh PostgreSQL database) holds N synthetic nodes
(``fleets.synthetic_nodes``, each written by a report) and 2N placements (rows spread
over the nodes: the reading cost does not depend on where they are). CPU of this process
(``time.process_time``; PostgreSQL's own is not counted) of:

- ``read_all_nodes_cpu_ms``: every node, as a round read them before issue 42
  (``SchedulerStore.nodes``);
- ``feed_whole_cpu_ms``: a placer's first read (``NodeFeed``: the whole inventory);
- ``feed_idle_cpu_ms``: its read after every lease was renewed and nothing changed;
- ``feed_one_changed_cpu_ms``: its read after one node reported a new label;
- ``state_cpu_ms``: the placements and their lifecycle read whole (``SchedulerStore.state``),
  as a round read them before the placement feed;
- ``placements_whole_cpu_ms``: a placer's first read of them (``PlacementFeed``: whole);
- ``placements_idle_cpu_ms``: its read when nothing was written since;
- ``placements_one_changed_cpu_ms``: its read after one replica report changed one state;
- ``round_reads_idle_cpu_ms``: what a round with nothing changed reads, both feeds.

One JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench.placement.fleets import NOW, node_report, synthetic_demands, synthetic_nodes
from bench.shared import common

BATCH = 1_000


def _url(store: str) -> str:
    if store == "postgresql":
        reason = common.pg_available()
        if reason is not None:
            raise SystemExit(reason)
        common.pg_recreate("llmgw_bench_round_reads")
        return common.pg_url("llmgw_bench_round_reads")
    scratch = common.CACHE / "round_reads"
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / "llmgw.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return f"sqlite:///{path}"


def _cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    began = time.process_time()
    result = fn()
    return (time.process_time() - began) * 1000, result


def measure(nodes: int, store_kind: str) -> dict[str, Any]:
    from sqlalchemy import insert

    from events.database.connection import WRITE, make_engine
    from events.database.migrate import upgrade
    from scheduler.lifecycle.staleness import DEFAULT_STALENESS
    from scheduler.persistence.placement_rows import placement_row
    from scheduler.persistence.round_store import placements_t
    from scheduler.persistence.store import SchedulerStore
    from scheduler.planner.fleet.inventory import parse_node_report
    from scheduler.planner.fleet.placements import Placement

    engine = make_engine(_url(store_kind))
    upgrade(engine)
    store = SchedulerStore(engine)
    fleet = synthetic_nodes(nodes)
    common.progress(f"round_reads: writing {nodes:,} nodes and {2 * nodes:,} placements")
    reported = NOW - timedelta(minutes=2)
    for start in range(0, nodes, BATCH):
        store.report(
            [parse_node_report(node_report(n)) for n in fleet[start : start + BATCH]],
            reported,
        )
    rows = []
    names = [n.name for n in fleet]
    i = 0
    for demand in synthetic_demands(2 * nodes):
        for replica in range(demand.replicas):
            profile = demand.profiles[0]
            rows.append(
                placement_row(
                    Placement(
                        demand.model,
                        replica,
                        profile.name,
                        (names[i % nodes],),
                        profile.gpus_per_node,
                        profile.gpu_class,
                        profile.min_memory_gb,
                    ),
                    1,
                    reported,
                )
            )
            i += 1
    with engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
        for start in range(0, len(rows), 5 * BATCH):
            conn.execute(insert(placements_t), rows[start : start + 5 * BATCH])

    def renew(at: Any) -> None:
        for start in range(0, nodes, 10 * BATCH):
            store.renew_leases(dict.fromkeys(names[start : start + 10 * BATCH], at))

    stale_after = DEFAULT_STALENESS.stale_after
    # The first node's agent reports replica states (none yet): the one that changes later.
    reporter = fleet[0]
    report_body = {"name": reporter.name, "gpu_class": reporter.gpu_class, "gpus": reporter.gpus}
    store.report([parse_node_report({**report_body, "replicas": []})], reported)
    renew(NOW)
    every, _ = _cpu(store.nodes)
    feed = store.node_feed()
    whole, first = _cpu(lambda: feed.read(NOW, stale_after))
    later = NOW + timedelta(seconds=10)
    renew(later)
    idle, quiet = _cpu(lambda: feed.read(later, stale_after))
    changed_at = later + timedelta(seconds=10)
    one = fleet[0]
    store.report(
        [
            parse_node_report(
                {
                    "name": one.name,
                    "gpu_class": one.gpu_class,
                    "gpus": one.gpus,
                    "labels": {**one.labels, "rack": "r9"},
                }
            )
        ],
        changed_at,
    )
    renew(changed_at)
    change, found = _cpu(lambda: feed.read(changed_at, stale_after))
    state_ms, state = _cpu(store.state)
    p_whole, p_idle, p_change = _placement_feed(store, report_body, rows[0], changed_at)
    engine.dispose()
    if not first.whole or quiet.whole or quiet.nodes or [n.name for n in found.nodes] != [one.name]:
        raise AssertionError("the feed did not read what changed")
    return {
        "nodes": nodes,
        "placements": len(state.placements),
        "store": store_kind,
        "read_all_nodes_cpu_ms": round(every, 1),
        "feed_whole_cpu_ms": round(whole, 1),
        "feed_idle_cpu_ms": round(idle, 2),
        "feed_one_changed_cpu_ms": round(change, 2),
        "state_cpu_ms": round(state_ms, 1),
        "placements_whole_cpu_ms": round(p_whole, 1),
        "placements_idle_cpu_ms": round(p_idle, 2),
        "placements_one_changed_cpu_ms": round(p_change, 2),
        "round_reads_idle_cpu_ms": round(idle + p_idle, 2),
    }


def _placement_feed(
    store: Any, report_body: dict[str, Any], hosted: dict[str, Any], at: datetime
) -> tuple[float, float, float]:
    """The placement feed's first read, its read with nothing written, and its read after
    one replica report (a replica on the reporting node starting)."""
    from scheduler.planner.fleet.inventory import parse_node_report

    placements = store.placement_feed()
    whole, first = _cpu(lambda: placements.read(at))
    idle, quiet = _cpu(lambda: placements.read(at + timedelta(seconds=10)))
    said = {"model": hosted["model"], "replica": hosted["replica"], "state": "starting"}
    store.report([parse_node_report({**report_body, "replicas": [said]})], at)
    change, found = _cpu(lambda: placements.read(at + timedelta(seconds=20)))
    key = (hosted["model"], hosted["replica"])
    if (
        not first.whole
        or quiet.changed
        or found.whole
        or found.state.lifecycle.statuses[key].state != "starting"
    ):
        raise AssertionError("the placement feed did not read what changed")
    return whole, idle, change


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.placement.round_reads")
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--store", choices=["sqlite", "postgresql"], default="sqlite")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.nodes, args.store)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
