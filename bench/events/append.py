"""Append: fully validated adds per second, one writer and four writer processes.

Each add goes through ``CatalogService.add``: the service takes the log's
write lock, catches up on what others appended, checks the model against the
whole catalog (names, aliases, fallbacks), appends with the hash chain and
commits. The catalog starts at 5,000 models (a generated log, copied afresh for
every measurement). Definitions are parsed beforehand: parsing a file is the
command line's work, not the log's.

Beside it, in the same run: the raw store (``SqlLog.append`` of one event,
no validation) and the ``eventsourcing`` library's single-event append on a
SQLite file with the same settings (WAL, ``synchronous=FULL``). SQLite is also
measured with ``synchronous=NORMAL``, clearly labelled, to show what the fsync
per commit costs; FULL remains the setting (an acknowledged add survives a
power loss).
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import shutil
import time
import uuid
from pathlib import Path
from queue import Empty
from typing import Any

import psycopg
from sqlalchemy import Engine, event

from bench.shared import common, gen
from catalog import Model, parse_model
from events.core.types import NewEvent
from events.database.connection import make_engine
from events.storage.backends import open_log

CATALOG_MODELS = 5_000
ADDS = 400
QUICK_ADDS = 60
WRITERS = 4


def _definitions(prefix: str, count: int) -> list[Model]:
    """``count`` new models with aliases and fallbacks to models of the 5,000-model catalog."""
    template = gen.templates()[0]
    out = []
    for i in range(count):
        body = {**template, "name": f"{prefix}-{i}", "source": f"org/{prefix}-{i}"}
        if i % 3 == 0:
            body["aliases"] = [f"{prefix}-{i}-latest"]
        if i % 4 == 0:
            body["fallbacks"] = ["prod-1-latest"]
        out.append(parse_model(body))
    return out


# -- databases: a fresh copy of the 5,000-model catalog for each measurement ----------


def _sqlite_copy(name: str) -> str:
    url, _ = gen.sqlite_log(CATALOG_MODELS, adds_only=True)
    return gen.copy_sqlite(url, name)


def _pg_copy(name: str) -> str:
    gen.pg_log(CATALOG_MODELS, adds_only=True)
    source = f"llmgw_bench_catalog_{CATALOG_MODELS}"
    with psycopg.connect(common.PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
    return common.pg_url(name)


def _engine(url: str, synchronous: str) -> Engine:
    engine = make_engine(url)
    if engine.dialect.name == "sqlite" and synchronous != "FULL":

        @event.listens_for(engine, "connect")
        def _relaxed(dbapi_conn: Any, _record: Any) -> None:
            # Registered after make_engine's own listener, so it wins: for comparison only.
            cursor = dbapi_conn.cursor()
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.close()

    return engine


# -- one writer --------------------------------------------------------------------


def _service_adds(url: str, synchronous: str, models: list[Model]) -> dict[str, Any]:
    engine = _engine(url, synchronous)
    try:
        service = gen.make_service(open_log(engine), gen.declared_catalog())
        warm = time.perf_counter()
        service.refresh()  # replays the 5,000-model catalog: not part of the figure
        # The replay runs with the collector paused (events.read.model); the one pass
        # it then owes over the objects it made belongs to the start-up too, not to
        # the first adds after it (it is about 60 ms, 0.2 ms an add over 300 adds).
        gc.collect()
        warm = time.perf_counter() - warm
        cpu = time.process_time()
        start = time.perf_counter()
        for model in models:
            service.add([model], actor="bench")
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu
        if len(service.catalog()) != CATALOG_MODELS + 20 + len(models):
            raise AssertionError("an add went missing")
        return {"seconds": seconds, "cpu": cpu, "adds": len(models), "warm": warm}
    finally:
        engine.dispose()


def _store_appends(url: str, synchronous: str, count: int) -> dict[str, Any]:
    """The bare store: one event per append, optimistic head, no validation at all."""
    engine = _engine(url, synchronous)
    try:
        store = open_log(engine)
        head = store.head()
        payload = gen.probe().payload({"model": gen.templates()[0]})
        gc.collect()
        cpu = time.process_time()
        start = time.perf_counter()
        for i in range(count):
            store.append(
                [NewEvent(type="model.added", model=f"raw-{i}", payload=payload)],
                expected_head=head,
            )
            head += 1
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "cpu": time.process_time() - cpu, "adds": count}
    finally:
        engine.dispose()


def _peer_appends(path: Path, count: int) -> dict[str, Any]:
    from bench.events.peer import peer_event, peer_recorder

    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    recorder = peer_recorder(path)
    # Written as our adds write it (bench.shared.gen.probe), so both sides store the same bytes.
    payload = gen.probe().payload({"model": gen.templates()[0]}).encode()
    # As many rows as our log holds before its adds (the 5,000-model catalog), so that
    # both sides insert into tables of the same size (outside the figure, in bulk).
    for first in range(0, CATALOG_MODELS, 1_000):
        recorder.insert_events(
            [
                peer_event(uuid.uuid4(), 1, "model.added", payload)
                for _ in range(min(1_000, CATALOG_MODELS - first))
            ]
        )
    gc.collect()
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in range(count):
        recorder.insert_events([peer_event(uuid.uuid4(), 1, "model.added", payload)])
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu
    recorder.datastore.close()
    return {"seconds": seconds, "cpu": cpu, "adds": count}


def _peer_app_saves(path: Path, count: int) -> dict[str, Any]:
    """The library's application saving one new aggregate per add (bench.events.peer_app)."""
    from bench.events.peer_app import CatalogModel, peer_application

    app = peer_application(path)
    definition = json.loads(gen.probe().payload({"model": gen.templates()[0]}))
    # As many aggregates as our catalog holds before its adds, saved in bulk outside the figure.
    for first in range(0, CATALOG_MODELS, 1_000):
        batch = min(1_000, CATALOG_MODELS - first)
        app.save(*[CatalogModel(dict(definition)) for _ in range(batch)])
    gc.collect()
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in range(count):
        app.save(CatalogModel(dict(definition)))
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu
    app.close()
    return {"seconds": seconds, "cpu": cpu, "adds": count}


# -- four writers ------------------------------------------------------------------


def _writer(  # noqa: PLR0917 - a process target takes positional arguments
    url: str, synchronous: str, index: int, count: int, start_at: float, queue: Any
) -> None:
    from bench.shared.common import quiet_logs

    quiet_logs()
    engine = _engine(url, synchronous)
    service = gen.make_service(open_log(engine), gen.declared_catalog())
    models = _definitions(f"w{index}", count)
    service.refresh()
    while time.time() < start_at:
        time.sleep(0.001)
    begin = time.time()
    attempts = gave_up = 0
    for model in models:
        # A command waits for the log's lock, then validates and appends: it
        # cannot lose a race, so there is nothing to retry (attempts stay 1).
        attempts += service.add([model], actor=f"writer-{index}").attempts
    end = time.time()
    engine.dispose()
    queue.put({"begin": begin, "end": end, "adds": count, "attempts": attempts, "gave_up": gave_up})


def _concurrent(url: str, synchronous: str, total: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    per_writer = total // WRITERS
    start_at = time.time() + 8.0  # after every writer has imported and caught up
    procs = [
        ctx.Process(target=_writer, args=(url, synchronous, i, per_writer, start_at, queue))
        for i in range(WRITERS)
    ]
    for proc in procs:
        proc.start()
    results: list[dict[str, Any]] = []
    while len(results) < len(procs):
        try:
            results.append(queue.get(timeout=5))
        except Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for proc in procs:
                    proc.kill()
                raise RuntimeError("a writer process failed; see its traceback above") from None
    for proc in procs:
        proc.join()
    if any(r["begin"] < start_at - 0.05 for r in results):
        raise AssertionError("a writer started early")
    begin = min(r["begin"] for r in results)
    end = max(r["end"] for r in results)
    adds = sum(r["adds"] for r in results)
    engine = make_engine(url)
    try:
        head = open_log(engine).head()
    finally:
        engine.dispose()
    if head != CATALOG_MODELS + adds:
        raise AssertionError(f"the log holds {head} events, expected {CATALOG_MODELS + adds}")
    return {
        "seconds": end - begin,
        "adds": adds,
        "retries": sum(r["attempts"] for r in results) - adds,
        "gave_up": sum(r["gave_up"] for r in results),
    }


# -- the table ---------------------------------------------------------------------


def run(quick: bool) -> list[common.Table]:
    adds = QUICK_ADDS if quick else ADDS
    table = common.Table(
        f"Append: fully validated adds against a catalog of {CATALOG_MODELS:,} models",
        [
            *("store", "writers", "what", "adds", "adds/s", "ms/add", "ms CPU/add"),
            *("retries", "gave up"),
        ],
    )
    scratch = common.CACHE / "append"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    models = _definitions("solo", adds)

    def row(store: str, writers: str, what: str, result: dict[str, Any]) -> None:
        table.add(
            store,
            writers,
            what,
            f"{result['adds']:,}",
            common.rate(result["adds"], result["seconds"]),
            f"{result['seconds'] / result['adds'] * 1000:.2f}",
            f"{result['cpu'] / result['adds'] * 1000:.2f}" if "cpu" in result else "-",
            str(result.get("retries", "-")),
            str(result.get("gave_up", "-")),
        )

    n = [0]

    def fresh_sqlite() -> str:
        n[0] += 1
        return _sqlite_copy(f"append/catalog-{n[0]}.sqlite")

    common.progress(f"append: SQLite, one writer, {adds} adds")
    # Ours and the peer's interleaved, three times; the better run of each is kept.
    ours: list[dict[str, Any]] = []
    peer: list[dict[str, Any]] = []
    peer_app: list[dict[str, Any]] = []
    for _ in range(3):
        ours.append(_service_adds(fresh_sqlite(), "FULL", models))
        peer.append(_peer_appends(scratch / "peer.sqlite", adds))
        peer_app.append(_peer_app_saves(scratch / "peer-app.sqlite", adds))
    best_ours, best_peer, best_app = _fastest(ours), _fastest(peer), _fastest(peer_app)
    row("SQLite", "1", "CatalogService.add (validated)", best_ours)
    row("SQLite", "1", "eventsourcing insert_events, 1 event", best_peer)
    row("SQLite", "1", "eventsourcing Application.save, 1 aggregate", best_app)
    table.note(
        "validated add against the reference, eventsourcing doing the same job (an "
        "aggregate created and saved: event, mapping, JSON, insert; bench.events.peer_app), this "
        f"run: {_ratio(best_app, best_ours, 'cpu')} in CPU per add, "
        f"{_ratio(best_app, best_ours, 'seconds')} in wall time per add "
        "(their cost / ours: above 1 is ahead); the wall time is mostly the fsync of "
        "each commit, which both pay once per add"
    )
    table.note(
        "context, against the library's bare single-event insert (no aggregate; issue 13's "
        f"first reference): {_ratio(best_peer, best_ours, 'cpu')} in CPU per add, "
        f"{_ratio(best_peer, best_ours, 'seconds')} in wall time per add"
    )
    row(
        "SQLite",
        "1",
        "SqlLog.append, 1 event (no validation)",
        _fastest([_store_appends(fresh_sqlite(), "FULL", adds) for _ in range(2)]),
    )
    row(
        "SQLite NORMAL*",
        "1",
        "CatalogService.add (validated)",
        _fastest([_service_adds(fresh_sqlite(), "NORMAL", models) for _ in range(2)]),
    )
    common.progress(f"append: SQLite, {WRITERS} writers")
    row(
        "SQLite",
        str(WRITERS),
        "CatalogService.add (validated)",
        _concurrent(fresh_sqlite(), "FULL", adds),
    )
    reason = common.pg_available()
    if reason is None:
        k = [0]

        def fresh_pg() -> str:
            k[0] += 1
            return _pg_copy(f"llmgw_bench_append_{k[0]}")

        common.progress("append: PostgreSQL")
        row(
            "PostgreSQL",
            "1",
            "CatalogService.add (validated)",
            _fastest([_service_adds(fresh_pg(), "FULL", models) for _ in range(2)]),
        )
        row(
            "PostgreSQL",
            "1",
            "SqlLog.append, 1 event (no validation)",
            _fastest([_store_appends(fresh_pg(), "FULL", adds) for _ in range(2)]),
        )
        row(
            "PostgreSQL",
            str(WRITERS),
            "CatalogService.add (validated)",
            _concurrent(fresh_pg(), "FULL", adds),
        )
        with psycopg.connect(common.PG_ADMIN, autocommit=True) as conn:
            for i in range(1, k[0] + 1):
                conn.execute(f'DROP DATABASE IF EXISTS "llmgw_bench_append_{i}" WITH (FORCE)')
    else:
        table.note(f"PostgreSQL rows missing: {reason}")
    shutil.rmtree(scratch, ignore_errors=True)
    table.note(
        "each `CatalogService.add` takes the log's write lock, catches up on what others "
        "appended, checks the model against the whole catalog, appends (hash chain, "
        "expected head) and commits; definitions are parsed beforehand; best of 2 runs "
        "(3 for the first three rows, interleaved), each on a fresh copy of the catalog; "
        "CPU is the process's own time (`time.process_time`)"
    )
    table.note(
        f"{WRITERS} writers: separate processes, each with its own service, started together; "
        "each command takes the log's write lock before it validates against the head, so "
        "writers queue instead of racing: `retries` and `gave up` stay 0 (they counted lost "
        "races when validation ran before the lock)"
    )
    table.note(
        "*SQLite NORMAL: `PRAGMA synchronous=NORMAL`, for comparison only (an add acknowledged "
        "then could be lost on power failure); the store runs with FULL"
    )
    table.note(f"PostgreSQL: `synchronous_commit` is the server's ({_pg_sync()})")
    return [table]


def _pg_sync() -> str:
    try:
        with psycopg.connect(common.PG_ADMIN) as conn:
            row = conn.execute("SHOW synchronous_commit").fetchone()
            fsync = conn.execute("SHOW fsync").fetchone()
        return f"synchronous_commit={row[0] if row else '?'}, fsync={fsync[0] if fsync else '?'}"
    except psycopg.Error:
        return "?"


def _fastest(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the least wall time per add, with the least CPU per add of any run
    (on a busy machine the two minima need not fall in the same run)."""
    best = min(results, key=lambda r: r["seconds"] / r["adds"])
    cpus = [r["cpu"] / r["adds"] for r in results if "cpu" in r]
    return {**best, "cpu": min(cpus) * best["adds"]} if cpus else best


def _ratio(theirs: dict[str, Any], ours: dict[str, Any], key: str) -> str:
    return f"{(theirs[key] / theirs['adds']) / (ours[key] / ours['adds']):.2f}x"
