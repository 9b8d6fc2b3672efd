"""Several real writer processes against one database: nothing lost, duplicated or torn."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence

from sqlalchemy import Engine, func, select

from catalog import Catalog
from events.core.chain import verify_chain
from events.database.tables import EventRow
from events.read.replay import replay
from events.storage.backends import open_log
from events.storage.chain_rows import read_chain, read_seal
from tests.conftest import REPO

WRITERS = 8
PER_WRITER = 15


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.procs", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "LLMGW_LOG_LEVEL": "ERROR"},
    )


def _finish(procs: Sequence[subprocess.Popen[str]]) -> list[dict[str, list[str]]]:
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def test_eight_concurrent_writers_all_succeed_and_lose_or_duplicate_nothing(
    db_url: str, engine: Engine
) -> None:
    procs = [_spawn("writer", db_url, f"w{i}", str(PER_WRITER)) for i in range(WRITERS)]
    tail = _spawn("tailer", db_url, "6")
    reports = _finish(procs)
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
        proc = _spawn("batch_writer", db_url, f"k{attempt}", str(batch))
        assert proc.stdout is not None
        # The writer may log to stdout too; "ready" follows its first committed batch.
        assert "ready" in (line.strip() for line in proc.stdout), proc.stderr
        # Kill it once it has committed at least one more batch (however loaded the
        # machine), at a different point in its next one each attempt.
        before = open_log(engine).head()
        while open_log(engine).head() == before and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(0.05 * attempt)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    with engine.connect() as conn:
        groups = conn.execute(
            select(EventRow.command_id, func.count()).group_by(EventRow.command_id)
        ).all()
    assert groups, "the writer appended something before it was killed"
    assert all(count == batch for _, count in groups), "every batch landed whole"
    events = list(open_log(engine).read())
    assert [e.position for e in events] == list(range(1, len(events) + 1))
    assert replay(Catalog.build([]), events).skipped == ()
