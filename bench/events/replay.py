"""Replay: rebuild the catalog from 10k, 100k and 1M stored events, on SQLite and PostgreSQL.

Beside each figure, measured in the same run and interleaved with it, the
floor: the same rows read with the driver's own cursor and their payload
decoded with ``json.loads``, and nothing else (no events built, no validation,
no catalog). Replay can never be faster than that; the ratio says how much of
the time goes to judging the events.

The sizes are prefixes of one generated log (``bench.shared.gen``): the catalog at
event N is what a log of N events gives. Every run checks that replay skipped
exactly the events the generator made bad, so a fast replay that stopped
judging would fail here rather than look good.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import psycopg
from sqlalchemy import Engine

from bench.shared import common, gen
from catalog import Catalog, CatalogError
from catalog.stored import fast_decode
from events.core.rows import ReplayEvent
from events.core.types import CURRENT_SCHEMA, DEFINITION_TYPES, StoredEvent
from events.database.connection import make_engine
from events.read.model import gc_paused
from events.read.replay import STORED_LIMITS, Replayer, ReplayResult, replay
from events.storage.backends import open_log
from events.storage.sql_log import SqlLog

SIZES = (10_000, 100_000, 1_000_000)
# The read paths are compared at this size (the 100k-event log).
LEAN_SIZE = 100_000
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


# What replay reads of a row: position, event_id, type, schema_version, payload.
_LEAN_COLUMNS = "position, event_id, type, schema_version, payload"
# The other columns are never used by replay, but today a row whose columns are
# not their types is skipped as unreadable; SQLite can say so in C, as one flag.
_LEAN_TYPES = (
    "typeof(event_id) = 'text' AND typeof(command_id) = 'text' AND typeof(type) = 'text' "
    "AND typeof(schema_version) = 'integer' AND typeof(model) IN ('text', 'null') "
    "AND typeof(payload) = 'text' AND typeof(actor) = 'text' AND typeof(reason) = 'text' "
    "AND typeof(recorded_at) = 'text'"
)


def _sqlite_batches(engine: Engine, until: int, columns: str) -> Iterator[list[Any]]:
    """Rows 1..until as plain tuples from the bare sqlite3 driver, 5,000 at a time."""
    import sqlite3

    conn = sqlite3.connect(str(engine.url.database))
    sql = (
        f"SELECT {columns} FROM events WHERE position > ? AND position <= ? "
        f"ORDER BY position LIMIT {BATCH}"
    )
    last = 0
    try:
        while True:
            rows = conn.execute(sql, (last, until)).fetchall()
            yield rows
            if len(rows) < BATCH:
                return
            last = rows[-1][0]
    finally:
        conn.close()


def lean_read(engine: Engine, until: int, *, typed: bool = False) -> int:
    """The read replay needs: 5 columns as tuples, no ``recorded_at`` conversion, no events."""
    columns = f"{_LEAN_COLUMNS}, {_LEAN_TYPES}" if typed else _LEAN_COLUMNS
    count = 0
    for rows in _sqlite_batches(engine, until, columns):
        count += len(rows)
    return count


def lean_floor(engine: Engine, until: int) -> int:
    """The lean read with each payload ``json.loads``-ed: the floor, on 5 columns."""
    loads = json.loads
    count = 0
    for rows in _sqlite_batches(engine, until, _LEAN_COLUMNS):
        for row in rows:
            try:  # noqa: SIM105 - suppress() would cost more than the decoding
                loads(row[4])
            except ValueError:
                pass
            count += 1
    return count


def lean_decode(engine: Engine, until: int) -> int:
    """The lean read with each payload decoded as replay needs it: a current-version add or
    replacement into its validated ``Model`` (``catalog.stored.fast_decode``, falling back to the
    general path), anything else ``json.loads``-ed. Nothing is judged against the catalog."""
    loads = json.loads
    decode = fast_decode.decode_added
    current = CURRENT_SCHEMA
    definitions = DEFINITION_TYPES
    count = 0
    for rows in _sqlite_batches(engine, until, _LEAN_COLUMNS):
        for _position, _event_id, type_, version, payload in rows:
            try:
                if type_ in definitions and version == current[type_]:
                    decode(payload, STORED_LIMITS)
                else:
                    loads(payload)
            except (ValueError, CatalogError):
                pass
            count += 1
    return count


class _LeanEvent:
    """What ``Replayer.apply`` reads of an event, built from a lean row (no ``recorded_at``)."""

    __slots__ = ("event_id", "payload", "position", "schema_version", "type", "unreadable")

    def __init__(  # noqa: PLR0917
        self,
        position: int,
        event_id: str,
        type_: str,
        schema_version: int,
        payload: str,
        unreadable: str | None,
    ) -> None:
        self.position = position
        self.event_id = event_id
        self.type = type_
        self.schema_version = schema_version
        self.payload = payload
        self.unreadable = unreadable


class _FastReplayer(Replayer):
    """A prototype of the wiring: replay's own judging, with the msgspec decoder tried first.

    Whatever it declines goes through ``Replayer._apply`` unchanged (today's pydantic fast
    path, then the general path), so every skip and reason is today's.
    """

    def _apply(self, event: StoredEvent | ReplayEvent) -> None:
        if (
            event.unreadable is None
            and event.type in DEFINITION_TYPES
            and event.schema_version == CURRENT_SCHEMA[event.type]
        ):
            model = fast_decode.decode_definition(event.payload)
            if model is not None:
                self._apply_definition(event.type, model)
                return
        super()._apply(event)


def lean_replay(engine: Engine, until: int, declared: Catalog) -> ReplayResult:
    """Replay from the lean, typed read through ``_FastReplayer``: what wiring would give."""
    replayer = _FastReplayer.start(declared)
    apply = replayer.apply
    columns = f"{_LEAN_COLUMNS}, {_LEAN_TYPES}"
    for rows in _sqlite_batches(engine, until, columns):
        for position, event_id, type_, version, payload, typed in rows:
            # A row with a column not of its type is skipped, as today, though the
            # reason here is shorter than the store's (which names each column).
            unreadable = None if typed else "columns not of their type"
            event = _LeanEvent(position, event_id, type_, version, payload, unreadable)
            apply(cast(StoredEvent, event))
    return replayer.result()


def read_paths(url: str, size: int, stats: gen.LogStats) -> common.Table:
    """The read floor against lean reads and decodes, on the SQLite log (for the Log adapter)."""
    engine = make_engine(url)
    store = open_log(engine)
    declared = gen.declared_catalog()
    checked: dict[str, Any] = {}

    def today() -> None:
        result = replay(declared, store.read(until=size))
        checked["today"] = (len(result.skipped), len(result.catalog))

    def startup() -> None:
        result = startup_replay(store, declared, size)
        checked["startup"] = (len(result.skipped), len(result.catalog))

    def lean() -> None:
        result = lean_replay(engine, size, declared)
        checked["lean"] = (len(result.skipped), len(result.catalog))

    jobs: dict[str, Callable[[], Any]] = {
        "floor: bare driver, 10 columns, `json.loads` (as above)": lambda: floor(engine, size),
        "`SqlLog.read` (StoredEvents, `recorded_at` converted)": lambda: read_only(store, size),
        "lean read: 5 columns as tuples": lambda: lean_read(engine, size),
        "lean read + a column-types flag computed by SQLite": lambda: lean_read(
            engine, size, typed=True
        ),
        "`SqlLog.read_for_replay` (every column, types checked in Python)": lambda: sum(
            1 for _ in store.read_for_replay(until=size)
        ),
        "lean read + `json.loads` (the floor on 5 columns)": lambda: lean_floor(engine, size),
        "lean read + `fast_decode` (adds to models, unjudged)": lambda: lean_decode(engine, size),
        "replay over whole events: `replay(declared, store.read())`": today,
        "replay as start-up runs it (lean read, collector paused)": startup,
        "lean typed read + `fast_decode` + replay's judging (prototype)": lean,
    }
    repeats = 3
    common.progress(f"replay read paths SQLite {size:,} events x{repeats}")
    try:
        fast_decode.clear_caches()
        best = common.best_of(repeats, *jobs.values())
        gc_was = gc.isenabled()
        gc.disable()
        try:
            best_nogc = common.best_of(repeats, lean)[0]
        finally:
            if gc_was:
                gc.enable()
    finally:
        engine.dispose()
    expected = (stats.bad_until(size), checked["today"][1])
    if checked["today"][0] != expected[0] or (
        checked["lean"] != expected or checked["startup"] != expected
    ):
        raise AssertionError(f"lean replay gave {checked['lean']}, today {checked['today']}")
    # The same two side by side in CPU time: on a shared machine a process waiting for a
    # core is billed in wall time, unevenly between the rows; replay and the floor are
    # single-threaded, so their CPU time is what they cost.
    common.progress(f"replay against the floor in CPU time, {size:,} events x5")
    cpu_floor, cpu_startup = best_of_cpu(
        5, lambda: floor(engine, size), lambda: startup_replay(store, declared, size)
    )
    t_floor = best[0]
    table = common.Table(
        f"Replay read paths (SQLite, {size:,} events)",
        ["path", "ev/s", "us/event", "of floor"],
    )
    for (name, _), seconds in zip(jobs.items(), best, strict=True):
        table.add(
            name,
            common.rate(size, seconds),
            f"{seconds / size * 1e6:.2f}",
            f"{t_floor / seconds:.2f}",
        )
    table.add(
        "the prototype, collector off",
        common.rate(size, best_nogc),
        f"{best_nogc / size * 1e6:.2f}",
        f"{t_floor / best_nogc:.2f}",
    )
    table.add(
        "floor, CPU time (`time.process_time`)",
        common.rate(size, cpu_floor),
        f"{cpu_floor / size * 1e6:.2f}",
        "1.00",
    )
    table.add(
        "replay as start-up runs it, CPU time",
        common.rate(size, cpu_startup),
        f"{cpu_startup / size * 1e6:.2f}",
        f"{cpu_floor / cpu_startup:.2f}",
    )
    table.note(
        "wall time, best of 3, interleaved; `of floor` is the floor's time / the row's time "
        "(above 1: faster than the floor); the two CPU-time rows: best of 5, interleaved, "
        "against each other"
    )
    table.note(
        "lean: `SELECT position, event_id, type, schema_version, payload` with the bare "
        "sqlite3 driver in batches of 5,000; the typed variant adds one `typeof()` flag so "
        "a row whose columns are not their types is still skipped (the store's own check)"
    )
    table.note(
        "prototype: bench/events/replay.py `_FastReplayer`, replay's `Replayer` with "
        "`catalog.stored.fast_decode.decode_definition` tried first; it skipped the same "
        f"{expected[0]:,} events and built the same {expected[1]:,}-model catalog"
    )
    return table


def best_of_cpu(repeats: int, *fns: Callable[[], Any]) -> list[float]:
    """``common.best_of`` in CPU seconds of this process."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            gc.collect()
            start = time.process_time()
            fn()
            best[i] = min(best[i], time.process_time() - start)
    return best


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
        import events.read.snapshots  # noqa: F401
    except ImportError:
        return "TODO", []
    code = f"""
import time, json, sys
t0 = time.perf_counter()
from bench.shared.common import quiet_logs
quiet_logs()
from bench.shared import gen
from events.storage.backends import open_log
from events.database.connection import make_engine
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
    from events.read.snapshots import SnapshotStore

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
                result = startup_replay(store, declared, size)
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
                import events.read.snapshots  # noqa: F401

                common.progress(f"snapshot start-up {store_name} {biggest:,}")
                _take_snapshot(url)
                status, cells = snapshot_startup(url, _models_at(store, biggest))
            except ImportError:
                pass
            if status == "TODO":
                snapshots.add(
                    store_name, f"{biggest:,}", "TODO: no events/read/snapshots.py", "", ""
                )
            else:
                snapshots.add(store_name, f"{biggest:,}", *cells)
    finally:
        engine.dispose()


def startup_replay(store: SqlLog, declared: Catalog, size: int) -> ReplayResult:
    """Replay the first ``size`` events as the read model's start-up does: the lean read
    (``SqlLog.read_for_replay``) with the cycle collector paused."""
    with gc_paused():
        return replay(declared, store.read_for_replay(until=size))


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
        "replay: as start-up runs it (events.read.model): `replay(declared, "
        "store.read_for_replay(until=N))` with the collector paused, every event judged; "
        "`of floor` is replay speed / floor speed; best of 3 (1 at 1M), interleaved with "
        "the floor"
    )
    table.note(
        "goal (issue 13): at 100,000 events on SQLite, `of floor` at least 0.80 and "
        "`replay ev/s` at least 100,000"
    )
    table.note(
        "the log: a generated mix (bench/shared/gen.py) of adds, removes, list adds, aliases and "
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
    paths = read_paths(url, LEAN_SIZE if not quick else sizes[-1], stats)
    reason = common.pg_available()
    if reason is None:
        url, stats = gen.pg_log(sizes[-1])
        _measure("PostgreSQL", url, stats, sizes, table, snapshots)
    else:
        table.note(f"PostgreSQL rows missing: {reason}")
    return [table, paths, snapshots]


def paths_only(size: int = LEAN_SIZE) -> list[common.Table]:
    """Only the read-paths table, on a SQLite log of ``size`` events."""
    url, stats = gen.sqlite_log(size)
    return [read_paths(url, size, stats)]


if __name__ == "__main__":
    # ``python -m bench.events.replay [N]``: the read-paths table alone (N events, 100,000
    # by default).
    import argparse

    from bench.shared.common import quiet_logs

    parser = argparse.ArgumentParser(
        prog="python -m bench.events.replay",
        description="The read-paths table alone (the whole area: python -m bench replay).",
    )
    parser.add_argument("events", nargs="?", type=int, default=LEAN_SIZE, help="log size")
    args = parser.parse_args()
    quiet_logs()
    for t in paths_only(args.events):
        common.emit(t)
