"""What one batch of node reports costs the writer thread, by part: ``python -m bench batch``.

Two parts of ``SchedulerStore.report_and_service`` measured apart from HTTP:

- the nodes' upsert on SQLite, one statement per row (``executemany``, as before)
  against multi-row statements (``SqliteBackend.upsert``), batches of 50 and 256,
  alone and with a second thread busy in Python as the event loop is; interleaved;
- the replica counts for the answer on a cluster of ``NODES`` nodes with
  ``bench.reports``' placements: read from every placement (a round was written
  since the last batch, or before ``HostedCounts``) against the kept counts
  (an index lookup of the newest round), both stores.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.dialects import sqlite

from bench import common
from bench.reports import _seed
from events.db import WRITE, make_engine
from events.migrate import upgrade
from scheduler.backend_sqlite import SQLITE
from scheduler.round_store import HostedCounts, read_service
from scheduler.tables import NodeRow, table

NODES, QUICK_NODES = 10_000, 1_000
BATCHES, QUICK_BATCHES = 200, 50
ROUNDS = 5
nodes_t = table(NodeRow)
Upsert = Callable[[Connection, list[dict[str, Any]]], None]


def _rows(k: int, size: int, nodes: int) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    return [
        {
            "name": f"n{(k * size + i) % nodes:05d}",
            "gpu_class": "A100",
            "gpus": 8,
            "gpus_reserved": 0,
            "memory_gb": 1024.0,
            "labels": '{"zone": "z1"}',
            "fabric": None,
            "reported_at": now,
        }
        for i in range(size)
    ]


def _executemany(conn: Connection, rows: list[dict[str, Any]]) -> None:
    stmt = sqlite.insert(nodes_t)
    upsert = stmt.on_conflict_do_update(
        index_elements=[nodes_t.c.name],
        set_={c: stmt.excluded[c] for c in rows[0] if c != "name"},
    )
    conn.execute(upsert, rows)


def _multi_row(conn: Connection, rows: list[dict[str, Any]]) -> None:
    SQLITE.upsert(conn, nodes_t, "name", rows)


def _batches(engine: Engine, upsert: Upsert, size: int, nodes: int, count: int) -> float:
    """Wall ms a batch (its own transaction and commit), run in a thread of its own."""
    took: list[float] = []

    def work() -> None:
        began = time.perf_counter()
        for k in range(count):
            with engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
                upsert(conn, _rows(k, size, nodes))
        took.append((time.perf_counter() - began) / count * 1000)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return took[0]


def _upserts(nodes: int, count: int, rounds: int) -> common.Table:
    table = common.Table(
        f"SQLite node upserts: wall ms a batch (transaction and commit), best of {rounds}, "
        f"{count} batches each",
        ["batch", "second thread", "executemany", "multi-row", "ratio"],
    )
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'upsert.db'}")
        upgrade(engine)
        _batches(engine, _multi_row, 50, nodes, count)  # every node's row exists
        stop = threading.Event()
        for busy in (False, True):
            spinner = threading.Thread(target=_spin, args=(stop,)) if busy else None
            if spinner:
                spinner.start()
            for size in (50, 256):
                best = {"old": float("inf"), "new": float("inf")}
                for _ in range(rounds):
                    best["old"] = min(
                        best["old"], _batches(engine, _executemany, size, nodes, count)
                    )
                    best["new"] = min(best["new"], _batches(engine, _multi_row, size, nodes, count))
                table.add(
                    size,
                    "busy" if busy else "-",
                    f"{best['old']:.2f} ms",
                    f"{best['new']:.2f} ms",
                    f"{best['old'] / best['new']:.2f}x",
                )
            if spinner:
                stop.set()
                spinner.join()
        engine.dispose()
    table.note(
        "busy: a second thread runs Python the whole time, as the event loop does under load"
    )
    return table


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


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
    count = QUICK_BATCHES if quick else BATCHES
    rounds = 2 if quick else ROUNDS
    common.progress("batch: SQLite upserts")
    upserts = _upserts(nodes, count, rounds)
    common.progress("batch: replica counts")
    return [upserts, _service(nodes, rounds)]
