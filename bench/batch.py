"""A batch of node reports' replica counts, apart from HTTP: ``python -m bench batch``.

What ``SchedulerStore.report_and_service`` pays for the answers' replica counts on
a cluster of ``NODES`` nodes with ``bench.reports``' placements: read from every
placement (what every batch paid before ``HostedCounts``, and now the first batch
after a round was written) against the kept counts (an index lookup of the newest
round's id), both stores, CPU of this process.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench import common
from bench.reports import _seed
from events.db import make_engine
from events.migrate import upgrade
from scheduler.persistence.round_store import HostedCounts, read_service

NODES, QUICK_NODES = 10_000, 1_000
ROUNDS = 5


def _service(nodes: int, rounds: int) -> common.Table:
    table = common.Table(
        f"A batch's replica counts, {nodes:,} nodes with bench.reports' placements: "
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
        "reading every placement is now paid once per round written (every 10 s at most by "
        "default), by the first batch after it"
    )
    return table


def run(quick: bool) -> list[common.Table]:
    nodes = QUICK_NODES if quick else NODES
    rounds = 2 if quick else ROUNDS
    common.progress("batch: replica counts")
    return [_service(nodes, rounds)]
