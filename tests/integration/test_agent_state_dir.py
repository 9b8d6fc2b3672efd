"""The agent's state dir and process guards, on real files and real processes."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent import processes
from agent.engines import Command
from agent.placements import Key
from agent.state import Record, StateDir, StateDirBusy


def record(model: str = "org/m", **kw: object) -> Record:
    fields: dict[str, Any] = {
        "model": model,
        "replica": 1,
        "fingerprint": "f",
        "engine": "sim",
        "argv": ("python", "-m", "agent.sim"),
        "pid": 123,
        "start_time": 1.5,
        "port": 8000,
        "endpoint": "http://h:8000",
        "devices": (0, 1),
        "started_at": 2.0,
        **kw,
    }
    return Record(**fields)


def test_records_survive_a_restart_and_forget_removes_them(tmp_path: Path) -> None:
    state = StateDir(tmp_path).create()
    state.save(record())
    state.save(record("org_m"))  # the same file-name characters, another model
    assert {r.model for r in StateDir(tmp_path).load()} == {"org/m", "org_m"}
    assert StateDir(tmp_path).load()[0].devices in {(0, 1)}
    state.forget(Key("org/m", 1))
    assert [r.model for r in state.load()] == ["org_m"]


def test_an_unreadable_record_is_set_aside_not_trusted(tmp_path: Path) -> None:
    state = StateDir(tmp_path).create()
    state.save(record())
    (state.engines / "broken.json").write_text('{"pid": 1')
    assert [r.model for r in state.load()] == ["org/m"]
    assert (state.engines / "broken.unreadable").exists()


def test_a_pid_is_the_same_engine_only_with_its_start_time_and_command_line(
    tmp_path: Path,
) -> None:
    argv = (sys.executable, "-c", "import time; time.sleep(60)")
    engine = processes.spawn(Command(argv, {}), tmp_path / "e.log", tmp_path, "n0nce")
    try:
        assert processes.same_process(engine.pid, engine.start_time, argv)
        # A reused pid: another start time, or another program.
        assert not processes.same_process(engine.pid, engine.start_time - 5, argv)
        # Within the tolerance for a boot time that moved with the clock: still the same.
        assert processes.same_process(engine.pid, engine.start_time + 1, argv)
        assert not processes.same_process(engine.pid, engine.start_time, ("other",))
        assert psutil.Process(engine.pid).cmdline() == list(argv)
    finally:
        codes = processes.stop([engine], grace=5)
    assert codes[engine.pid] == -15
    assert not processes.same_process(engine.pid, engine.start_time, argv)


def test_an_engine_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)"
    )
    argv = (sys.executable, "-c", code)
    engine = processes.spawn(Command(argv, {}), tmp_path / "e.log", tmp_path, "n0nce")
    while "up" not in (tmp_path / "e.log").read_text():
        time.sleep(0.05)
    assert processes.stop([engine], grace=0.5)[engine.pid] == -9


def test_the_group_is_stopped_with_the_engine(tmp_path: Path) -> None:
    # An engine's own workers (vLLM starts some) must not outlive it.
    code = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(c.pid, flush=True); time.sleep(60)"
    )
    log = tmp_path / "e.log"
    engine = processes.spawn(Command((sys.executable, "-c", code), {}), log, tmp_path, "n0nce")
    while not log.read_text().strip():
        time.sleep(0.05)
    worker = psutil.Process(int(log.read_text().split()[0]))
    processes.stop([engine], grace=5)
    worker.wait(timeout=5)
    assert not worker.is_running()


def test_the_end_of_a_log_is_one_printable_line(tmp_path: Path) -> None:
    log = tmp_path / "e.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(100)) + b"bad \x1b[31mred\x00\n")
    assert processes.tail(log) == "line 96 | line 97 | line 98 | line 99 | bad ?[31mred?"
    log.write_text("x" * 5000)
    assert len(processes.tail(log)) == processes.MAX_MESSAGE
    assert processes.tail(tmp_path / "absent.log") == ""


def test_an_engine_environment_carries_its_cards(tmp_path: Path) -> None:
    argv = (sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")
    engine = processes.spawn(
        Command(argv, {"CUDA_VISIBLE_DEVICES": "2,3"}), tmp_path / "l", tmp_path, "n0nce"
    )
    assert engine.popen is not None and engine.popen.wait(10) == 0
    assert (tmp_path / "l").read_text().strip() == "2,3"


def test_a_state_dir_is_held_by_one_agent_at_a_time(tmp_path: Path) -> None:
    first = StateDir(tmp_path).create()
    first.lock()
    first.lock()  # again from the same agent: already held
    with pytest.raises(StateDirBusy, match=rf"used by another agent \(pid {os.getpid()}\)"):
        StateDir(tmp_path).create().lock()
