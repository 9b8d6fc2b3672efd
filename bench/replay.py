"""Replay: rebuild the catalog from 10k, 100k and 1M stored events, on SQLite and PostgreSQL.

Beside each figure, measured in the same run and interleaved with it, the
floor: the same rows read with the driver's own cursor and their payload
decoded with ``json.loads``, and nothing else (no events built, no validation,
no catalog). Replay can never be faster than that; the ratio says how much of
the time goes to judging the events.

The sizes are prefixes of one generated log (``bench.gen``): the catalog at
event N is what a log of N events gives. Every run checks that replay skipped
exactly the events the generator made bad, so a fast replay that stopped
judging would fail here rather than look good.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import Engine

from bench import common, gen
from events.backends import open_log
from events.db import make_engine
from events.replay import replay
from events.store import SqlLog

SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (2_000, 10_000, 20_000)
_COLUMNS = (
    "position, event_id, command_id, type, schema_version, model, payload, actor, reason, "
    "recorded_at"
)
BATCH = 5_000


def floor(engine: Engine, until: int) -> int:
    """Read positions 1..until in batches of 5,000 with the bare driver and decode each payload."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        import sqlite3

        conn: Any = sqlite3.connect(str(url.database))
        mark = "?"
    else:
        conn = psycopg.connect(common.pg_dsn(str(url.database)))
        mark = "%s"
    sql = (
        f"SELECT {_COLUMNS} FROM events WHERE position > {mark} AND position <= {mark} "
        f"ORDER BY position LIMIT {BATCH}"
    )
    decoded = 0
    last = 0
    loads = json.loads
    try:
        while True:
            cursor = conn.cursor()
            cursor.execute(sql, (last, until))
            rows = cursor.fetchall()
            cursor.close()
            if url.get_backend_name() != "sqlite":
                conn.rollback()
            for row in rows:
                try:  # noqa: SIM105 - suppress() would cost more than the decoding
                    loads(row[6])
                except ValueError:
                    pass
                decoded += 1
            if len(rows) < BATCH:
                return decoded
            last = rows[-1][0]
    finally:
        conn.close()


def read_only(store: SqlLog, until: int) -> int:
    count = 0
    for _ in store.read(until=until):
        count += 1
    return count


def snapshot_startup(url: str, declared_check: int) -> tuple[str, list[str]]:
    """Start-up time of a ``CatalogService`` that restores a snapshot, in a fresh process.

    Returns a row label and the cells; a TODO row when this release has no snapshots.
    """
    try:
        import events.snapshots  # noqa: F401
    except ImportError:
        return "TODO", []
    code = f"""
import time, json, sys
t0 = time.perf_counter()
from bench.__main__ import quiet_logs
quiet_logs()
from bench import gen
from events.backends import open_log
from events.db import make_engine
from events.catalog_service import CatalogService
t1 = time.perf_counter()
store = open_log(make_engine({url!r}))
declared = gen.declared_catalog()
t2 = time.perf_counter()
service = CatalogService(store, declared, "catalog.yaml")
result = service.refresh()
t3 = time.perf_counter()
print(json.dumps({{"imports": t1 - t0, "ready": t3 - t2, "total": t3 - t0,
                  "position": result.position, "models": len(result.catalog)}}))
"""
    env = {**os.environ, "PYTHONPATH": str(common.REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=common.REPO,
        env=env,
    ).stdout
    data = json.loads(out.strip().splitlines()[-1])
    if data["models"] != declared_check:
        raise AssertionError(f"snapshot start-up gave {data['models']} models")
    return "ok", [common.ms(data["ready"]), common.ms(data["total"]), str(data["position"])]


def _take_snapshot(url: str) -> None:
    """Replay the whole log once through the service, which then takes a snapshot at its head."""
    from events.snapshots import SnapshotStore

    engine = make_engine(url)
    try:
        store = open_log(engine)
        head = store.head()
        taken = SnapshotStore(engine).taken()
        if any(s.position == head for s in taken):
            return
        service = gen.make_service(store, gen.declared_catalog(), snapshot_every=1)
        service.refresh()
    finally:
        engine.dispose()


def _measure(  # noqa: PLR0917
    store_name: str,
    url: str,
    stats: gen.LogStats,
    sizes: tuple[int, ...],
    table: common.Table,
    snapshots: common.Table,
) -> None:
    engine = make_engine(url)
    store = open_log(engine)
    declared = gen.declared_catalog()
    try:
        for size in sizes:
            expected_bad = stats.bad_until(size)
            checked: dict[str, Any] = {}

            def ours(size: int = size, checked: dict[str, Any] = checked) -> None:
                result = replay(declared, store.read(until=size))
                checked["skipped"] = len(result.skipped)
                checked["models"] = len(result.catalog)

            jobs: list[Callable[[], Any]] = [
                lambda size=size: floor(engine, size),  # type: ignore[misc]
                lambda size=size: read_only(store, size),  # type: ignore[misc]
                ours,
            ]
            repeats = 1 if size >= 1_000_000 else 3
            common.progress(f"replay {store_name} {size:,} events x{repeats}")
            t_floor, t_read, t_ours = common.best_of(repeats, *jobs)
            if checked["skipped"] != expected_bad:
                raise AssertionError(
                    f"replay of {size} events skipped {checked['skipped']}, expected {expected_bad}"
                )
            table.add(
                store_name,
                f"{size:,}",
                common.rate(size, t_floor),
                common.rate(size, t_read),
                common.rate(size, t_ours),
                common.ms(t_ours),
                f"{t_floor / t_ours:.2f}",
                f"{checked['skipped']:,}",
                f"{checked['models']:,}",
            )
        # Start-up at the largest size, with a snapshot.
        biggest = sizes[-1]
        if stats.events == biggest:
            status, cells = "TODO", list[str]()
            try:
                import events.snapshots  # noqa: F401

                common.progress(f"snapshot start-up {store_name} {biggest:,}")
                _take_snapshot(url)
                status, cells = snapshot_startup(url, _models_at(store, biggest))
            except ImportError:
                pass
            if status == "TODO":
                snapshots.add(store_name, f"{biggest:,}", "TODO: no events/snapshots.py", "", "")
            else:
                snapshots.add(store_name, f"{biggest:,}", *cells)
    finally:
        engine.dispose()


def _models_at(store: SqlLog, size: int) -> int:
    return len(replay(gen.declared_catalog(), store.read(until=size)).catalog)


def run(quick: bool) -> list[common.Table]:
    sizes = QUICK_SIZES if quick else SIZES
    table = common.Table(
        "Replay: rebuild the catalog from the log",
        [
            "store",
            "events",
            "floor ev/s",
            "read ev/s",
            "replay ev/s",
            "replay time",
            "of floor",
            "skipped",
            "models",
        ],
    )
    table.note(
        "floor: the same rows fetched with the bare driver (sqlite3 / psycopg) in batches of "
        "5,000 and each payload `json.loads`-ed; nothing validated, no event objects built"
    )
    table.note("read: `SqlLog.read` alone (rows to `StoredEvent`s, no decoding)")
    table.note(
        "replay: `replay(declared, store.read(until=N))`, every event judged; `of floor` is "
        "replay speed / floor speed; best of 3 (1 at 1M), interleaved with the floor"
    )
    table.note(
        "the log: a generated mix (bench/gen.py) of adds, removes, list adds, aliases and "
        "fallbacks over ~3,000 live runtime models and 20 declared ones, with ~0.1% bad "
        "events; `skipped` is checked against the bad events the generator wrote"
    )
    snapshots = common.Table(
        "Start-up with a snapshot (fresh process, `CatalogService.refresh()`)",
        ["store", "events", "catalog ready", "incl. imports", "position"],
    )
    snapshots.note(
        "the snapshot is taken at the head of the log by a service that replayed it all; "
        "`catalog ready` is from constructing the service to the catalog being served"
    )
    common.progress("replay: checking generated adds against to_definition()")
    gen.sample_check()
    url, stats = gen.sqlite_log(sizes[-1])
    _measure("SQLite", url, stats, sizes, table, snapshots)
    reason = common.pg_available()
    if reason is None:
        url, stats = gen.pg_log(sizes[-1])
        _measure("PostgreSQL", url, stats, sizes, table, snapshots)
    else:
        table.note(f"PostgreSQL rows missing: {reason}")
    return [table, snapshots]
