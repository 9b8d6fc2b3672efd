"""Several real writer processes against one database: nothing lost, duplicated or torn."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from sqlalchemy import Engine, func, select

from catalog import Catalog
from events.core.chain import verify_chain
from events.database.tables import EventRow
from events.read.replay import replay
from events.storage.backends import open_log
from events.storage.chain_rows import read_chain, read_seal
from tests import procs

WRITERS = 8
PER_WRITER = 15

# Each writer is a process of its own, forked from a server that imported tests.procs
# (and SQLAlchemy, the catalog and the log with it) once: separate processes with
# separate connections, as before, without 0.5 s of imports each. Forked from that
# server, never from this worker, whose engines, threads and locks a fork would copy.
_FORKS = multiprocessing.get_context("forkserver")
_FORKS.set_forkserver_preload(["tests.procs"])


def _run(out: Connection, role: Callable[..., Any], *args: Any) -> None:
    os.environ["LLMGW_LOG_LEVEL"] = "ERROR"
    out.send(role(*args))


def _spawn(role: Callable[..., Any], *args: Any) -> tuple[BaseProcess, Connection]:
    theirs, ours = _FORKS.Pipe(duplex=False)
    proc = _FORKS.Process(target=_run, args=(ours, role, *args), daemon=True)
    proc.start()
    ours.close()
    return proc, theirs


def _finish(started: Sequence[tuple[BaseProcess, Connection]]) -> list[dict[str, Any]]:
    reports = []
    for proc, answer in started:
        assert answer.poll(120), f"{proc.name} said nothing within 120 s"
        reports.append(answer.recv())
        proc.join(30)
        assert proc.exitcode == 0, f"{proc.name} exited {proc.exitcode}"
    return reports


def test_eight_concurrent_writers_all_succeed_and_lose_or_duplicate_nothing(
    db_url: str, engine: Engine
) -> None:
    writers = [_spawn(procs.writer, db_url, f"w{i}", PER_WRITER) for i in range(WRITERS)]
    tail = _spawn(procs.tailer, db_url, 6.0)
    reports = _finish(writers)
    store = open_log(engine)
    events = list(store.read())
    positions = [e.position for e in events]
    assert positions == list(range(1, len(events) + 1)), "positions must be gapless"
    assert verify_chain(read_chain(store.engine), read_seal(store.engine)).ok, (
        "racing appends kept the hash chain"
    )

    recorded = Counter(e.model for e in events)
    added = Counter(name for r in reports for name in r["added"])
    assert recorded == added, "every acknowledged add is in the log exactly once, nothing else"
    assert all(count == 1 for count in recorded.values())
    # No command gave up: each waited for the lock, then validated and appended.
    assert [r["conflicts"] for r in reports] == [[]] * WRITERS
    # Each writer's own models all landed (only the shared names were contested).
    for i, report in enumerate(reports):
        assert {f"w{i}-{n}" for n in range(PER_WRITER)} <= set(report["added"])
    # Every shared name was won by exactly one writer; the others were refused.
    for n in range(PER_WRITER):
        assert recorded[f"shared-{n}"] == 1

    result = replay(Catalog.build([]), events)
    assert result.skipped == ()
    assert set(result.catalog.names()) == set(recorded)

    (tailed,) = _finish([tail])
    seen = [int(p) for p in tailed["seen"]]
    assert seen == list(range(1, len(seen) + 1)), "a tailing reader saw every position in order"


def test_a_writer_killed_mid_append_leaves_no_partial_event(db_url: str, engine: Engine) -> None:
    batch = 40
    for attempt in range(3):
        ready = _FORKS.Event()
        proc, _ = _spawn(procs.batch_writer, db_url, f"k{attempt}", batch, ready.set)
        # Set once its first batch is committed.
        assert ready.wait(120) and proc.is_alive(), f"the writer did not start: {proc.exitcode}"
        # Kill it once it has committed at least one more batch (however loaded the
        # machine), at a different point in its next one each attempt.
        before = open_log(engine).head()
        while open_log(engine).head() == before and proc.is_alive():
            time.sleep(0.05)
        time.sleep(0.05 * attempt)
        proc.kill()  # SIGKILL
        proc.join(30)

    with engine.connect() as conn:
        groups = conn.execute(
            select(EventRow.command_id, func.count()).group_by(EventRow.command_id)
        ).all()
    assert groups, "the writer appended something before it was killed"
    assert all(count == batch for _, count in groups), "every batch landed whole"
    events = list(open_log(engine).read())
    assert [e.position for e in events] == list(range(1, len(events) + 1))
    assert replay(Catalog.build([]), events).skipped == ()
