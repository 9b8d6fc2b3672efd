"""The six attacks on the agent's state directory of issue 25, each failing safely.

With write access to ``--state-dir`` an attacker used to: overwrite a file through a
link at ``agent.lock``; overwrite one through a link at a record's temporary file;
truncate one through a link at an engine's log; have the agent adopt (and then kill)
an unrelated process by forging its record; send the end of any file to the control
plane by naming it as a dead engine's log; hang the agent, deaf to SIGTERM, with a
FIFO among its records. Each is played here on real files and real processes, and
each ends in a named refusal (a structured log line) with nothing outside the state
directory touched. Then the directory itself: the agent refuses one that others
could change.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from structlog.testing import capture_logs

from agent import processes
from agent.inventory import Inventory
from agent.logfiles import LogLimits, rotate_if_large
from agent.placements import Key
from agent.runtime import Agent, AgentConfig
from agent.safefs import UnsafeDir, UnsafeFile
from agent.state import StateDir
from tests.integration.test_agent_runtime import StandIn, placement, tick_until

BOUND = 60.0
SECRET = "root:x:0:0:TOP-SECRET-LINE\n"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside the state dir that no attack may change or read."""
    path = tmp_path / "victim"
    path.write_text(SECRET * 4)
    return path


def _agent(state: Path, server: StandIn, **config: Any) -> Agent:
    return Agent(
        AgentConfig(node="n1", state_dir=state, engine_host="127.0.0.1", stop_grace=5, **config),
        Inventory(gpu_class="SIM", devices=(0, 1), memory_gb=64.0, cpus=2),
        # StandIn plays the ControlPlane client, a class (not a Protocol) it does not subclass.
        server,  # type: ignore[arg-type]
    )


@pytest.fixture
def stranger() -> Iterator[psutil.Process]:
    """An unrelated process of the same user: not started by any agent."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        yield psutil.Process(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def _forged(stranger: psutil.Process, **extra: Any) -> dict[str, Any]:
    return {
        "model": "chat",
        "replica": 0,
        "fingerprint": "f",
        "engine": "sim",
        "argv": stranger.cmdline(),
        "pid": stranger.pid,
        "start_time": stranger.create_time(),
        "port": 8000,
        "endpoint": "http://127.0.0.1:8000",
        "devices": [0],
        "started_at": 0.0,
        **extra,
    }


def test_a_link_at_the_lock_file_is_refused_and_its_target_untouched(
    tmp_path: Path, victim: Path
) -> None:
    state = StateDir(tmp_path / "state").create()
    (state.root / "agent.lock").symlink_to(victim)
    with pytest.raises(UnsafeFile, match=r"agent\.lock is a symbolic link.*remove it"):
        state.lock()
    assert victim.read_text() == SECRET * 4


def test_links_at_a_records_temporary_file_and_at_the_record_are_not_written_through(
    tmp_path: Path, victim: Path
) -> None:
    state = StateDir(tmp_path / "state").create()
    agent = _agent(state.root, StandIn([]))
    record_path = state.record_path(Key("chat", 0))
    # The temporary name older agents used, and the record itself.
    record_path.with_suffix(".tmp").symlink_to(victim)
    other = tmp_path / "other"
    other.write_text("untouched")
    record_path.symlink_to(other)
    server = StandIn([placement("chat", [])])
    agent.server = server  # type: ignore[assignment]  # a StandIn, as above
    try:
        tick_until(agent, server, "starting")
    finally:
        agent.shutdown()
    assert victim.read_text() == SECRET * 4
    assert other.read_text() == "untouched"


def test_a_link_at_an_engines_log_is_not_truncated_by_a_rotation(
    tmp_path: Path, victim: Path
) -> None:
    state = StateDir(tmp_path / "state").create()
    log_path = state.log_path(Key("chat", 0))
    log_path.symlink_to(victim)
    with capture_logs() as logs:
        assert not rotate_if_large(log_path, LogLimits(max_bytes=10, keep=1))
    assert victim.read_text() == SECRET * 4
    assert not log_path.with_name(log_path.name + ".1").exists()
    (refusal,) = [x for x in logs if x["event"] == "agent.log_refused"]
    assert "symbolic link" in refusal["reason"] and refusal["path"] == str(log_path)
    # And an engine started there: its log is refused, the engine is reported failed.
    server = StandIn([placement("chat", [])])
    agent = _agent(state.root, server)
    try:
        failed = tick_until(agent, server, "failed")
    finally:
        agent.shutdown()
    assert "cannot start the engine" in failed["message"]
    assert "symbolic link" in failed["message"]
    assert victim.read_text() == SECRET * 4


def test_a_link_at_a_rotated_copy_does_not_receive_the_log(tmp_path: Path, victim: Path) -> None:
    state = StateDir(tmp_path / "state").create()
    log_path = state.log_path(Key("chat", 0))
    log_path.write_text("x" * 100)
    log_path.with_name(log_path.name + ".1").symlink_to(victim)
    assert rotate_if_large(log_path, LogLimits(max_bytes=10, keep=1))
    assert victim.read_text() == SECRET * 4
    assert log_path.with_name(log_path.name + ".1").read_text() == "x" * 100  # a file now
    assert log_path.read_text() == ""


def test_a_forged_record_of_an_unrelated_process_is_refused_and_the_process_left_alone(
    tmp_path: Path, stranger: psutil.Process
) -> None:
    state = StateDir(tmp_path / "state").create()
    path = state.record_path(Key("chat", 0))
    # Every field of the stranger ps shows, and a nonce the stranger does not carry.
    path.write_text(json.dumps(_forged(stranger, nonce="f0rged")))
    server = StandIn([])  # nothing placed: an adopted engine would be stopped
    agent = _agent(state.root, server)
    with capture_logs() as logs:
        agent.adopt()
        agent.tick()
        agent.shutdown()
    refusals = [x for x in logs if x["event"] == "agent.adoption_refused"]
    # Failed once in a full run (1 of 5 on 2026-12-08), not reproduced alone in 25 runs
    # under load: what the agent logged instead, and the stranger as ps sees it now,
    # so that the next failure says why.
    assert len(refusals) == 1, (logs, stranger.status(), stranger.cmdline(), _forged(stranger))
    (refusal,) = refusals
    assert refusal["pid"] == stranger.pid
    assert refusal["record"] == str(path)
    assert "does not carry the record's nonce" in refusal["reason"]
    assert not [x for x in logs if x["event"] in ("agent.engine_adopted", "agent.engine_stopped")]
    assert stranger.is_running() and stranger.status() != psutil.STATUS_ZOMBIE
    assert not path.exists()  # dropped
    # A record without any nonce (an older agent's) is refused the same way.
    path.write_text(json.dumps(_forged(stranger)))
    with capture_logs() as logs:
        _agent(state.root, server).adopt()
    (refusal,) = [x for x in logs if x["event"] == "agent.adoption_refused"]
    assert "carries no nonce" in refusal["reason"]
    assert stranger.is_running()


def test_an_engine_this_agent_started_is_adopted_by_its_next_life(tmp_path: Path) -> None:
    """The refusal above must not cost the real thing: a restarted agent adopts its engine."""
    state = tmp_path / "state"
    server = StandIn([placement("chat", [])])
    first = _agent(state, server, leave_engines=True)
    tick_until(first, server, "ready")
    (pid,) = [p.pid for p in first.procs.values()]
    first.shutdown()  # leaves the engine running
    second = _agent(state, server)
    with capture_logs() as logs:
        second.adopt()
    try:
        assert [x["pid"] for x in logs if x["event"] == "agent.engine_adopted"] == [pid]
        assert environ_nonce(pid) == second.records[Key("chat", 0)].nonce != ""
    finally:
        second.shutdown()
    # Adopted, it is this agent's to stop: it ends.
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(BOUND)


def environ_nonce(pid: int) -> str | None:
    return psutil.Process(pid).environ().get(processes.NONCE_VAR)


def test_a_forged_log_path_never_sends_another_files_end_to_the_control_plane(
    tmp_path: Path, victim: Path
) -> None:
    state = StateDir(tmp_path / "state").create()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    forged = {
        "model": "chat",
        "replica": 0,
        "fingerprint": "f",
        "engine": "sim",
        "argv": ["x"],
        "pid": dead.pid,
        "start_time": 1.0,
        "port": 8000,
        "endpoint": "http://127.0.0.1:8000",
        "devices": [0],
        "started_at": 0.0,
        "log_path": str(victim),  # what older agents wrote, and read back
        "nonce": "n",
    }
    state.record_path(Key("chat", 0)).write_text(json.dumps(forged))
    server = StandIn([placement("chat", [])])
    agent = _agent(state.root, server)
    try:
        agent.adopt()
        agent.tick()
    finally:
        agent.shutdown()
    (replica,) = server.reports[0]["replicas"]
    assert replica["state"] == "failed"
    assert "TOP-SECRET" not in json.dumps(server.reports)
    assert "while the agent was not running" in replica["message"]


def test_a_fifo_among_the_records_neither_hangs_the_agent_nor_stops_sigterm(
    tmp_path: Path,
) -> None:
    state = StateDir(tmp_path / "state").create()
    fifo = state.record_path(Key("chat", 0))
    os.mkfifo(fifo)
    os.mkfifo(state.log_path(Key("chat", 0)))
    with capture_logs() as logs:
        records = state.load()
    assert records == []
    (refusal,) = [x for x in logs if x["event"] == "agent.record_refused"]
    assert "not a regular file" in refusal["reason"]
    assert fifo.with_suffix(".unreadable").exists()
    # A real agent on such a directory, reporting to nothing that answers: it reaches its
    # loop (its first report fails) and SIGTERM ends it.
    os.mkfifo(fifo)
    token = tmp_path / "token"
    token.write_text("llmgw_x\n")
    llmgw = str(Path(sys.executable).parent / "llmgw")
    with (tmp_path / "agent.log").open("wb") as out:
        proc = subprocess.Popen(
            [llmgw, "agent", "--server", "http://127.0.0.1:9", "--token-file", str(token),
             "--node", "n1", "--state-dir", str(state.root), "--interval", "1"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "LLMGW_SETTINGS": ""},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + BOUND
        while "agent.server_unreachable" not in (tmp_path / "agent.log").read_text():
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()
            assert time.monotonic() < deadline, "the agent never reached its first report"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(BOUND) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "agent.record_refused" in (tmp_path / "agent.log").read_text()


def test_a_state_dir_others_could_change_is_refused_naming_the_path_and_the_fix(
    tmp_path: Path,
) -> None:
    root = tmp_path / "state"
    StateDir(root).create()
    assert root.stat().st_mode & 0o777 == 0o700
    os.chmod(root, 0o770)
    with pytest.raises(UnsafeDir, match=rf"{root} is writable by its group.*chmod go-w {root}"):
        StateDir(root).create()
    os.chmod(root, 0o700)
    os.chmod(root / "engines", 0o777)
    with pytest.raises(UnsafeDir, match=r"engines is writable by its group or by others"):
        StateDir(root).create()
    os.chmod(root / "engines", 0o700)
    # A parent this user owns, writable by others and not sticky.
    os.chmod(tmp_path, 0o777)
    try:
        with pytest.raises(UnsafeDir, match=rf"{tmp_path}, a parent of the state dir"):
            StateDir(root).create()
        os.chmod(tmp_path, 0o1777)  # sticky, as /tmp: no one can rename our entries
        StateDir(root).create()
    finally:
        os.chmod(tmp_path, 0o700)
    # The state dir as a link to a directory.
    link = tmp_path / "link"
    link.symlink_to(root)
    with pytest.raises(UnsafeDir, match="is not a directory"):
        StateDir(link).create()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_state_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "state"
    StateDir(root).create()
    os.chown(root, 65534, 65534)
    with pytest.raises(UnsafeDir, match=rf"{root} is owned by uid 65534.*chown"):
        StateDir(root).create()
    os.chown(root, 0, 0)
    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o755)
    os.chown(parent, 65534, 65534)
    with pytest.raises(UnsafeDir, match=rf"{parent}, a parent of the state dir .* uid 65534"):
        StateDir(parent / "state").create()


def test_the_agent_command_refuses_an_unsafe_state_dir_with_a_log_line(tmp_path: Path) -> None:
    root = tmp_path / "state"
    StateDir(root).create()
    os.chmod(root, 0o777)
    token = tmp_path / "token"
    token.write_text("llmgw_x\n")
    llmgw = str(Path(sys.executable).parent / "llmgw")
    done = subprocess.run(
        [llmgw, "agent", "--server", "http://127.0.0.1:9", "--token-file", str(token),
         "--node", "n1", "--state-dir", str(root)],
        check=False, capture_output=True, text=True, timeout=BOUND,
        env={**os.environ, "LLMGW_SETTINGS": ""},
    )  # fmt: skip
    assert done.returncode != 0
    assert f"chmod go-w {root}" in done.stderr
    lines = [json.loads(x) for x in (done.stdout + done.stderr).splitlines() if x.startswith("{")]
    assert [x for x in lines if x["event"] == "agent.state_dir_refused"]
