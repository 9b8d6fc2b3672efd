"""Many `llmgw` commands meeting a brand-new database at once: one migrates, none fails."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import forkserver
from tests.e2e.cli import Cli

STARTED_TOGETHER = 4


@pytest.fixture(params=["sqlite", "postgres"])
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    if request.param == "sqlite":
        return Cli(tmp_path, f"sqlite:///{tmp_path / 'fresh.db'}")
    return Cli(tmp_path, str(request.getfixturevalue("empty_pg_url")))


def test_commands_started_together_on_a_new_database_all_succeed(fresh: Cli) -> None:
    files = [
        fresh.write(
            f"m{i}.yaml",
            {
                "name": f"m{i}",
                "source": f"org/m{i}",
                "profiles": [{"name": "p", "gpu_class": "T4"}],
            },
        )
        for i in range(STARTED_TOGETHER)
    ]
    # Forked (tests/forkserver.py) as every command of the suite is: separate processes,
    # each with its own connections, started within milliseconds of each other rather than
    # each after half a second of its own imports (LLMGW_TEST_FORK=0 starts them fresh).
    procs = [
        forkserver.popen(
            ["add", name],
            cwd=fresh.workdir,
            env=fresh.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for name in files
    ]
    outcomes = [
        (proc.wait(timeout=120), proc.stderr.read().decode() if proc.stderr else "")
        for proc in procs
    ]
    assert outcomes == [(0, "")] * STARTED_TOGETHER
    assert sorted(m["name"] for m in fresh.json("models")) == [
        f"m{i}" for i in range(STARTED_TOGETHER)
    ]
    assert fresh("verify").returncode == 0
