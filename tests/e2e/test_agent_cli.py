"""`llmgw agent` refuses what it cannot run with, naming the flag and what to write instead."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.state import StateDir
from tests.e2e.cli import Cli


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    (tmp_path / "agent.token").write_text("llmgw_x\n")
    cli = Cli(tmp_path, f"sqlite:///{tmp_path}/unused.db")
    for name in ("LLMGW_SERVER", "LLMGW_AGENT_TOKEN_FILE", "LLMGW_GPUS", "LLMGW_LABELS"):
        cli.env.pop(name, None)
    return cli


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([], "--server is required (or env LLMGW_SERVER, or server in [agent] of llmgw.toml)"),
        (["--server", "http://x"], "--token-file is required"),
        (["--server", "http://x", "--token-file", "absent"], "cannot read a token from absent"),
        (
            ["--server", "http://x", "--token-file", "agent.token", "--gpus", "A100"],
            "--gpus 'A100' is not CLASS:COUNT",
        ),
        (
            ["--server", "http://x", "--token-file", "agent.token", "--labels", "zone"],
            "--labels item 'zone' is not KEY=VALUE",
        ),
        (
            ["--server", "http://x", "--token-file", "agent.token", "--interval", "0"],
            "--interval: 0.0 must be a positive duration",
        ),
    ],
)
def test_the_agent_refuses_a_setting_it_cannot_run_with(
    cli: Cli, args: list[str], said: str
) -> None:
    done = cli("agent", *args)
    assert done.returncode == 1
    assert said in done.stderr
    assert not (cli.workdir / "unused.db").exists()  # the agent has no database


def test_a_second_agent_on_the_same_state_dir_is_refused(cli: Cli, tmp_path: Path) -> None:
    held = StateDir(tmp_path / "state").create()
    held.lock()  # as a running agent holds it
    done = cli(
        "agent", "--server", "http://x", "--token-file", "agent.token", "--gpus", "none",
        "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    assert done.returncode == 1
    assert f"is used by another agent (pid {os.getpid()})" in done.stderr
