"""Where a validated add's CPU goes, phase by phase, beside eventsourcing's insert.

``python -m bench.events.append_phases [--adds N] [--rounds R]``: in fresh processes,
alternating, R times each: our ``CatalogService.add`` on a copy of the
5,000-model catalog with ``synchronous=FULL``; the same with ``NORMAL`` (no
fsync: what each phase costs when the process does not resume from a wait
before it); and eventsourcing's ``insert_events`` of one event on a table
holding as many rows, with ``FULL`` and with ``NORMAL``. Each phase is the thread CPU time
(``time.thread_time``) spent inside one function, wrapped for the
measurement; the wrappers cost about a microsecond each, which lands in the
phases and in ``the rest``. The median of the rounds is printed per phase.

The phases are nested as they run: ``SqlLockedLog.append`` (``events.storage.log.WriteSection``)
holds ``chained_rows`` (ids, time, hash chain) and the insert statement, so the
insert's row is the difference; ``wrote`` holds the replay of the command's own
event. ``the rest`` is the add's thread time less the listed phases: the
command's own code around them (locks, context managers, result objects).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.shared import common

CATALOG_MODELS = 5_000

OURS = (
    ("check_command", "the grammar of actor, reason, key"),
    ("BEGIN", "BEGIN IMMEDIATE (theirs: BEGIN)"),
    ("last row", "SELECT of the last row (head, time, hash)"),
    ("check_add", "validation against the catalog"),
    ("encode", "definition_event: the definition's JSON"),
    ("chain", "chained_rows: ids, time, event hash"),
    ("INSERT", "the insert statement and its row"),
    ("COMMIT", "COMMIT (WAL frames, fdatasync; checkpoints)"),
    ("log", "the catalog.appended log call"),
    ("replay", "wrote: the command's own event applied"),
)


def _timer() -> tuple[dict[str, float], Callable[..., Any]]:
    spent: dict[str, float] = collections.defaultdict(float)
    clock = time.thread_time

    def wrap(owner: Any, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[label] += clock() - start

        setattr(owner, name, timed)

    return spent, wrap


def _ours(adds: int, synchronous: str) -> dict[str, float]:  # noqa: PLR0915 (imports, wraps)
    from bench.events import append
    from bench.shared import gen
    from bench.shared.common import quiet_logs
    from catalog.whole import state
    from events.read import model as read_model
    from events.storage import log as event_log
    from events.storage import sql_log, sqlite_log
    from events.storage.backends import open_log
    from events.write import commands

    quiet_logs()
    spent, wrap = _timer()
    wrap(commands, "check_command", "check_command")
    wrap(read_model.CatalogReadModel, "catch_up_locked", "last row")
    wrap(state.CatalogState, "check_add", "check_add")
    wrap(commands, "definition_event", "encode")
    wrap(event_log, "chained_rows", "chain")
    wrap(sql_log.SqlLockedLog, "append", "append")
    wrap(read_model.CatalogReadModel, "wrote", "replay")

    class _Log:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def info(self, *args: Any, **kwargs: Any) -> None:
            start = time.thread_time()
            self.inner.info(*args, **kwargs)
            spent["log"] += time.thread_time() - start

    commands.log = _Log(commands.log)

    def section(self: Any, conn: Any) -> Any:
        start = time.thread_time()
        conn.execute("BEGIN IMMEDIATE")
        spent["BEGIN"] += time.thread_time() - start
        try:
            yield sql_log.SqlLockedLog(conn, self.engine.dialect)
        except BaseException:
            conn.rollback()
            raise
        start = time.thread_time()
        conn.commit()
        spent["COMMIT"] += time.thread_time() - start

    sqlite_log.SqliteLog._section = section  # type: ignore[method-assign]
    (common.CACHE / "append").mkdir(parents=True, exist_ok=True)
    url = append._sqlite_copy(f"append/phases-{os.getpid()}.sqlite")
    engine = append._engine(url, synchronous)
    try:
        models = append._definitions("phase", adds)
        service = gen.make_service(open_log(engine), gen.declared_catalog())
        service.refresh()
        gc.collect()
        spent.clear()
        total = 0.0
        for model in models:
            start = time.thread_time()
            service.add([model], actor="bench")
            total += time.thread_time() - start
    finally:
        engine.dispose()
        for suffix in ("", "-wal", "-shm"):
            Path(url.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)
    spent["INSERT"] = spent.pop("append") - spent["chain"]
    spent["total"] = total
    return {k: v / adds * 1e6 for k, v in spent.items()}


def _theirs(adds: int, synchronous: str) -> dict[str, float]:
    import eventsourcing.sqlite as es

    from bench.events.peer import peer_event, peer_recorder
    from bench.shared import gen

    spent, wrap = _timer()
    wrap(es.SQLiteTransaction, "__enter__", "BEGIN")
    wrap(es.SQLiteApplicationRecorder, "_insert_events", "INSERT")
    wrap(es.SQLiteConnection, "commit", "COMMIT")
    path = common.CACHE / f"phases-peer-{os.getpid()}.sqlite"
    recorder = peer_recorder(path, synchronous)
    try:
        payload = gen.probe().payload({"model": gen.templates()[0]}).encode()
        for start in range(0, CATALOG_MODELS, 1_000):
            batch = min(1_000, CATALOG_MODELS - start)
            recorder.insert_events(
                [peer_event(uuid.uuid4(), 1, "model.added", payload) for _ in range(batch)]
            )
        events = [peer_event(uuid.uuid4(), 1, "model.added", payload) for _ in range(adds)]
        gc.collect()
        spent.clear()
        total = 0.0
        for one in events:
            begin = time.thread_time()
            recorder.insert_events([one])
            total += time.thread_time() - begin
    finally:
        recorder.datastore.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    spent["total"] = total
    return {k: v / adds * 1e6 for k, v in spent.items()}


def _child(kind: str, adds: int) -> None:
    side, synchronous = kind.split("-")
    result = _theirs(adds, synchronous) if side == "theirs" else _ours(adds, synchronous)
    print(json.dumps(result))


def _run(kind: str, adds: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.events.append_phases", "--child", kind, "--adds", str(adds)],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--adds", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.adds)
        return
    kinds = ("ours-FULL", "ours-NORMAL", "theirs-FULL", "theirs-NORMAL")
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for i in range(args.rounds):
        common.progress(f"append_phases: round {i + 1} of {args.rounds}")
        for kind, found in runs.items():
            found.append(_run(kind, args.adds))

    def median(kind: str, key: str) -> float | None:
        values = [r[key] for r in runs[kind] if key in r]
        return statistics.median(values) if values else None

    table = common.Table(
        f"A validated add's CPU by phase (us of thread time per add, median of {args.rounds})",
        [
            *("phase", "ours, FULL", "ours, NORMAL*"),
            *("eventsourcing, FULL", "eventsourcing, NORMAL*", "what"),
        ],
    )

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    listed = dict.fromkeys(runs, 0.0)
    for key, what in OURS:
        row = [median(kind, key) for kind in runs]
        for kind, value in zip(runs, row, strict=True):
            listed[kind] += value or 0.0
        table.add(key, *(cell(v) for v in row), what)
    totals = [median(kind, "total") for kind in runs]
    table.add(
        "the rest",
        *(cell((t or 0.0) - listed[k]) for k, t in zip(runs, totals, strict=True)),
        "the add's own code around the phases",
    )
    table.add("total", *(cell(t) for t in totals), "the add's thread time")

    def ratio(sync: str) -> str:
        ours, theirs = median(f"ours-{sync}", "total"), median(f"theirs-{sync}", "total")
        return f"{ours / theirs:.2f}x" if ours and theirs else "-"

    table.note(
        "*NORMAL: `synchronous=NORMAL`, no fsync per commit, for comparison only: the same "
        "code when the process has not just resumed from waiting on the disk; "
        f"ours / theirs in total thread CPU: FULL {ratio('FULL')}, NORMAL {ratio('NORMAL')}"
    )
    table.note(
        f"both tables hold {CATALOG_MODELS:,} rows before the adds; fresh processes, "
        "alternating; the phase wrappers' own cost (about 1 us each) is in the figures"
    )
    print(table.render())


if __name__ == "__main__":
    main()
