"""Writers: concurrent `llmgw add` commands on a brand-new database, as operators run them.

Eight workers, each running `llmgw add` (a process per command) one after
another, all started together on a database nobody has used yet, so the
first commands also race to migrate it. What counts is that no command fails
(`failed`), that the log is gapless and holds exactly one event per add, and
that `llmgw verify` passes; the time is reported for scale, not as a target.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from bench.shared import common
from events.database.connection import make_engine
from events.storage.backends import open_log

WRITERS = 8
ADDS = 100
QUICK_ADDS = 10
LLMGW = str(Path(sys.executable).parent / "llmgw")


def _worker(workdir: Path, env: dict[str, str], index: int, adds: int, out: list[Any]) -> None:
    failures: list[str] = []
    for n in range(adds):
        name = f"w{index}-{n}"
        path = workdir / f"{name}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": name,
                    "source": f"org/{name}",
                    "profiles": [{"name": "p", "gpu_class": "T4"}],
                }
            )
        )
        done = subprocess.run(
            [LLMGW, "add", str(path), "--actor", f"writer-{index}"],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            failures.append(done.stderr.strip().splitlines()[-1] if done.stderr else "?")
    out.append(failures)


def _run(url: str, workdir: Path, adds: int) -> dict[str, Any]:
    env = {**os.environ, "LLMGW_DATABASE_URL": url, "LLMGW_LOG_LEVEL": "ERROR"}
    env.pop("LLMGW_CONFIG", None)
    results: list[Any] = []
    threads = [
        threading.Thread(target=_worker, args=(workdir, env, i, adds, results))
        for i in range(WRITERS)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    failures = [f for r in results for f in r]
    engine = make_engine(url)
    try:
        positions = [e.position for e in open_log(engine).read()]
    finally:
        engine.dispose()
    verify = subprocess.run(
        [LLMGW, "verify"], cwd=workdir, env=env, capture_output=True, text=True, check=False
    )
    return {
        "seconds": seconds,
        "failed": len(failures),
        "first_failure": failures[0] if failures else "",
        "events": len(positions),
        "gapless": positions == list(range(1, len(positions) + 1)),
        "verify": "ok" if verify.returncode == 0 else verify.stderr.strip()[:80],
    }


def run(quick: bool) -> list[common.Table]:
    adds = QUICK_ADDS if quick else ADDS
    table = common.Table(
        f"Writers: {WRITERS} concurrent `llmgw add` loops of {adds} commands on a new database",
        ["store", "commands", "failed", "events", "gapless", "verify", "seconds"],
    )
    scratch = common.CACHE / "writers"
    shutil.rmtree(scratch, ignore_errors=True)

    def row(store: str, result: dict[str, Any]) -> None:
        table.add(
            store,
            WRITERS * adds,
            result["failed"],
            result["events"],
            "yes" if result["gapless"] else "NO",
            result["verify"],
            f"{result['seconds']:.0f}",
        )
        if result["first_failure"]:
            table.note(f"{store}: first failure: {result['first_failure']}")

    (scratch / "sqlite").mkdir(parents=True)
    common.progress("writers: SQLite")
    row("SQLite", _run(f"sqlite:///{scratch / 'sqlite' / 'llmgw.db'}", scratch / "sqlite", adds))
    reason = common.pg_available()
    if reason is None:
        database = "llmgw_bench_writers"
        common.pg_recreate(database)
        (scratch / "pg").mkdir()
        common.progress("writers: PostgreSQL")
        row("PostgreSQL", _run(common.pg_url(database), scratch / "pg", adds))
    else:
        table.note(f"PostgreSQL row missing: {reason}")
    table.note(
        "each command is a process (`llmgw add FILE`); the database is new, so the first "
        "commands also migrate it; a command takes the log's write lock before it validates "
        "against the head, so writers queue and none gives up"
    )
    shutil.rmtree(scratch, ignore_errors=True)
    return [table]
