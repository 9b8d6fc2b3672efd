"""SQLite leadership cannot be stolen by touching files beside the database."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_daemon import Env, logs, wait_for


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    # The database in a directory of its own: everything beside it is its own or llmgw's.
    (tmp_path / "db").mkdir()
    env = Env(tmp_path, f"sqlite:///{tmp_path / 'db' / 'llmgw.db'}")
    env.llmgw("db", "upgrade")
    yield env
    for proc, _ in env.daemons:
        proc.kill()
        proc.wait()


def _count(path: Path, event: str) -> int:
    return sum(1 for e in logs(path) if e["event"] == event)


def test_deleting_or_replacing_files_beside_the_database_does_not_make_a_second_leader(
    env: Env,
) -> None:
    leader, leader_log = env.start_daemon(interval=0.2)
    wait_for(lambda: _count(leader_log, "placement.round") > 0, "the first daemon to lead")
    database = env.workdir / "db" / "llmgw.db"
    sqlite_own = {database.name, f"{database.name}-wal", f"{database.name}-shm"}
    beside = [p for p in database.parent.iterdir() if p.name not in sqlite_own]
    for path in beside:  # what a tidy-up of the directory does
        path.unlink()
        path.write_text("replaced\n")
    (database.parent / "llmgw.db.scheduler.lock").write_text("")  # the old lock file's name

    second, second_log = env.start_daemon(interval=0.2)
    wait_for(lambda: _count(second_log, "placement.waiting") >= 3, "the second daemon to wait")
    assert _count(second_log, "placement.round") == 0, "a second daemon led beside the first"
    assert leader.poll() is None

    leader.send_signal(signal.SIGKILL)
    leader.wait(timeout=10)
    wait_for(lambda: _count(second_log, "placement.round") > 0, "the second to take over")
    assert second.poll() is None
