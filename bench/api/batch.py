"""A batch of node reports' replica counts, apart from HTTP: ``python -m bench batch``.

What ``SchedulerStore.report_and_service`` pays for the answers' replica counts on
a cluster of ``NODES`` nodes with ``bench.api.reports``' placements: read from every
placement (what every batch paid before ``HostedCounts``, and now the first batch
after a round was written) against the kept counts (an index lookup of the newest
round's id), both stores, CPU of this process.

Two more tables, for what a batch still read beyond its own nodes: the first batch
after a round (every placement read again, against the kept counts moved by the
round's trail, ``HostedCounts``), and the placements a batch's replica states are
checked against (every replica of the models the batch names, against the batch's
own (model, replica) pairs, ``record_replica_reports``).
"""

from __future__ import annotations

import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.api.reports import _seed
from bench.shared import common
from events.database.connection import make_engine
from events.database.migrate import upgrade
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.placement_rows import read_placements
from scheduler.persistence.round_store import HostedCounts, read_service
from scheduler.persistence.store import SchedulerStore
from scheduler.planner.fleet.placements import Placement, Plan, Removal

NODES, QUICK_NODES = 10_000, 1_000
ROUNDS = 5


def _service(nodes: int, rounds: int) -> common.Table:
    table = common.Table(
        f"A batch's replica counts, {nodes:,} nodes with bench.api.reports' placements: "
        f"ms of CPU, best of {rounds}",
        ["store", "read every placement", "kept counts (round id looked up)", "ratio"],
    )
    with tempfile.TemporaryDirectory() as tmp:
        urls = [("SQLite", f"sqlite:///{Path(tmp) / 'service.db'}")]
        if common.pg_available() is None:
            common.pg_recreate("llmgw_bench_batch")
            urls.append(("PostgreSQL", common.pg_url("llmgw_bench_batch")))
        for name, url in urls:
            engine = make_engine(url)
            upgrade(engine)
            engine.dispose()
            _seed(url, nodes)
            engine = make_engine(url)
            kept = HostedCounts()
            full, cached = float("inf"), float("inf")
            with engine.connect() as conn:
                kept.read(conn)
                for _ in range(rounds):
                    began = time.process_time()
                    read_service(conn)
                    full = min(full, time.process_time() - began)
                    began = time.process_time()
                    for _ in range(100):
                        kept.read(conn)
                    cached = min(cached, (time.process_time() - began) / 100)
            engine.dispose()
            table.add(
                name, f"{full * 1000:.1f} ms", f"{cached * 1000:.3f} ms", f"{full / cached:,.0f}x"
            )
    table.note(
        "reading every placement is now paid by a process's first batch, after more than "
        "20 rounds between two batches, or when a round's trail cannot be read; after a "
        "round the counts are moved by its trail (next table)"
    )
    return table


def _after_a_round(nodes: int, rounds: int) -> list[common.Table]:
    after = common.Table(
        f"The first batch after a round that moved 20 replicas, {nodes:,} nodes with "
        f"bench.api.reports' placements: ms of CPU, best of {rounds}",
        ["store", "read every placement (before)", "counts moved by the trail (now)", "ratio"],
    )
    own = common.Table(
        f"A batch of 50 reports' replica states, {nodes:,} nodes: the placements read to "
        f"check them, ms of CPU, best of {rounds}",
        [
            "store",
            "every replica of the models named (before)",
            "the batch's own replicas (now)",
            "ratio",
        ],
    )
    with tempfile.TemporaryDirectory() as tmp:
        urls = [("SQLite", f"sqlite:///{Path(tmp) / 'after.db'}")]
        if common.pg_available() is None:
            common.pg_recreate("llmgw_bench_batch_after")
            urls.append(("PostgreSQL", common.pg_url("llmgw_bench_batch_after")))
        for name, url in urls:
            engine = make_engine(url)
            upgrade(engine)
            engine.dispose()
            _seed(url, nodes)
            engine = make_engine(url)
            store = SchedulerStore(engine)
            kept = HostedCounts()
            with engine.connect() as conn:
                kept.read(conn)
            before_round = kept._known
            state = store.state()
            gone = state.placements[:10]
            new = tuple(
                Placement(f"new{i}", 0, "one", (p.nodes[0],), 8, "A100", 80)
                for i, p in enumerate(gone)
            )
            plan = Plan(
                keep=(), place=new, remove=tuple(Removal(p, "bench") for p in gone), unplaced=()
            )
            store.apply(
                plan,
                based_on=state,
                catalog_position=0,
                nodes=store.nodes(),
                now=common_now(),
                policy=StalenessPolicy(),
            )
            # The replicas of 50 nodes' reports, as one batch brings them (nodes 100-149:
            # about one replica each, of 50 different models).
            batch = [
                p
                for p in state.placements
                if p.profile == "one" and 100 <= int(p.nodes[0][1:]) < 150
            ]
            keys = [(p.model, p.replica) for p in batch]
            models = sorted({p.model for p in batch})
            full = moved = by_model = by_key = float("inf")
            with engine.connect() as conn:
                for _ in range(rounds):
                    began = time.process_time()
                    read_service(conn)
                    full = min(full, time.process_time() - began)
                    kept._known = before_round  # the counts as the last round left them
                    began = time.process_time()
                    kept.read(conn)
                    moved = min(moved, time.process_time() - began)
                    began = time.process_time()
                    read_placements(conn, models)
                    by_model = min(by_model, time.process_time() - began)
                    began = time.process_time()
                    read_placements(conn, keys=keys)
                    by_key = min(by_key, time.process_time() - began)
                assert dict(kept.read(conn)) == read_service(conn)[1]
            engine.dispose()
            after.add(
                name, f"{full * 1000:.1f} ms", f"{moved * 1000:.2f} ms", f"{full / moved:,.0f}x"
            )
            own.add(
                name,
                f"{by_model * 1000:.1f} ms ({len(models)} models)",
                f"{by_key * 1000:.2f} ms ({len(keys)} replicas)",
                f"{by_model / by_key:,.0f}x",
            )
    return [after, own]


def common_now() -> datetime:
    return datetime.now(UTC)


def run(quick: bool) -> list[common.Table]:
    nodes = QUICK_NODES if quick else NODES
    rounds = 2 if quick else ROUNDS
    common.progress("batch: replica counts")
    return [_service(nodes, rounds), *_after_a_round(nodes, rounds)]
