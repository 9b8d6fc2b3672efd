"""The placement daemon as a real process: placing, stopping cleanly, leading, surviving outages."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import forkserver
from tests.conftest import PG_ADMIN
from tests.e2e.agents import eventually
from tests.support import dump_yaml

NODES = {
    "nodes": [
        {"name": f"gpu-{i}", "gpu_class": "T4", "gpus": 4, "memory_gb": 128, "fabric": "eth-1"}
        for i in range(3)
    ]
}


def _model(name: str, replicas: int) -> dict[str, Any]:
    return {
        "name": name,
        "source": f"org/{name}",
        "scaling": {"min": replicas},
        "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 2}],
    }


class Env:
    def __init__(self, workdir: Path, url: str) -> None:
        self.workdir = workdir
        self.url = url
        self.env = {**os.environ, "LLMGW_DATABASE_URL": url}
        self.env.pop("LLMGW_CONFIG", None)
        self.daemons: list[tuple[forkserver.Forked | subprocess.Popen[bytes], Path]] = []

    def llmgw(self, *args: str) -> subprocess.CompletedProcess[str]:
        # Forked from a process that has llmgw imported (tests/forkserver.py), as the
        # daemons are.
        done = forkserver.run(args, cwd=self.workdir, env=self.env, timeout=60)
        assert done.returncode == 0, done.stderr
        return done

    def write(self, name: str, data: Any) -> str:
        (self.workdir / name).write_text(dump_yaml(data))
        return name

    def start_daemon(
        self, interval: float = 0.3
    ) -> tuple[forkserver.Forked | subprocess.Popen[bytes], Path]:
        log = self.workdir / f"daemon-{len(self.daemons)}.log"
        with log.open("wb") as stderr:  # the child keeps its own copy
            # Forked (tests/forkserver.py): the same `llmgw daemon`, without ~1 s of CPU of
            # imports; a fresh process with LLMGW_TEST_FORK=0.
            proc = forkserver.popen(
                ["daemon", "--interval", str(interval)],
                cwd=self.workdir,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        self.daemons.append((proc, log))
        return proc, log

    def placements(self) -> list[dict[str, Any]]:
        return list(json.loads(self.llmgw("placements", "--json").stdout))


def logs(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def _said(path: Path, event: str) -> bool:
    return any(e["event"] == event for e in logs(path))


def rounds(path: Path) -> int:
    """How many rounds the daemon logging to ``path`` has run."""
    return sum(e["event"] == "placement.round" for e in logs(path))


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def sqlite_env(tmp_path: Path) -> Iterator[Env]:
    env = Env(tmp_path, f"sqlite:///{tmp_path / 'llmgw.db'}")
    env.llmgw("db", "upgrade")
    yield env
    for proc, _ in env.daemons:
        proc.kill()


@pytest.fixture
def pg_env(tmp_path: Path, pg_url: str) -> Iterator[Env]:
    env = Env(tmp_path, pg_url)
    yield env
    for proc, _ in env.daemons:
        proc.kill()
        proc.wait()


def test_the_daemon_places_a_new_model_and_stops_cleanly_on_sigterm(sqlite_env: Env) -> None:
    env = sqlite_env
    proc, log = env.start_daemon()
    env.llmgw("nodes", "report", env.write("nodes.yaml", NODES))
    env.llmgw("add", env.write("m.yaml", _model("qwen", 2)))
    wait_for(lambda: len(env.placements()) == 2, "the daemon to place both replicas")

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    events = logs(log)
    rounds = [e for e in events if e["event"] == "placement.round"]
    assert rounds, "one log line per round"
    assert {
        "round",
        "catalog_position",
        "nodes",
        "placed",
        "removed",
        "unplaced",
        "duration_ms",
    } <= set(rounds[-1])
    assert sum(r["placed"] for r in rounds) == 2
    assert events[-1]["event"] == "placement.stopped"


@pytest.mark.slow  # (tests/xdist_groups.py: handed out first)
def test_a_second_sigterm_ends_the_daemon_while_its_round_is_stuck(pg_env: Env) -> None:
    """The first signal waits for the round in progress; when that round is stuck (here
    on a table another session holds locked: up to its lock timeout, the leadership
    lease, 16 s at an 8 s interval, room for a busy machine), a second one ends the
    process at once, as an operator pressing Ctrl-C twice expects."""
    env = pg_env
    env.llmgw("db", "upgrade")
    env.llmgw("nodes", "report", env.write("nodes.yaml", NODES))
    env.llmgw("add", env.write("m.yaml", _model("qwen", 1)))
    holder = psycopg.connect(env.url.replace("postgresql+psycopg://", "postgresql://"))
    try:
        # The daemon's first round waits to read the placements.
        holder.execute("LOCK TABLE placements IN ACCESS EXCLUSIVE MODE")
        proc, log = env.start_daemon(interval=8)
        wait_for(lambda: _said(log, "placement.started"), "the daemon started")
        time.sleep(1.0)
        assert rounds(log) == 0, "no round can finish while the table is locked"
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: _said(log, "placement.stopping"), "the first signal taken")
        time.sleep(1.0)
        assert proc.poll() is None, "the first signal waits for the round in progress"
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
        assert time.monotonic() - began < 5
    finally:
        holder.rollback()
        holder.close()
    forced = [e for e in logs(log) if e["event"] == "placement.stop_forced"]
    assert len(forced) == 1 and forced[0]["signal"] == "SIGTERM"
    assert not _said(log, "placement.stopped")
    # Nothing the cut round began was kept, and the next daemon places as usual once the
    # lapsed lease is taken over.
    assert env.placements() == []
    again, _ = env.start_daemon()
    wait_for(lambda: len(env.placements()) == 1, "a new daemon to place it", timeout=60)
    again.send_signal(signal.SIGTERM)
    assert again.wait(timeout=20) == 0


def _signal_thread(pid: int, tid: int, signum: int) -> None:
    """tgkill(2): the signal handed to one thread of ``pid``, as the kernel may hand any."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(234, pid, tid, signum) != 0:  # SYS_tgkill on x86_64
        raise OSError(ctypes.get_errno(), f"tgkill {pid} {tid}")


def test_sigterm_stops_the_daemon_whichever_of_its_threads_the_kernel_hands_it_to(
    sqlite_env: Env,
) -> None:
    # A process-directed signal goes to any thread that does not block it; Python runs
    # the handler on the main thread only when that thread wakes. A main thread waiting
    # without a timeout never did: the daemon ignored SIGTERM for as long as a round's
    # thread was the one that took it.
    env = sqlite_env
    proc, log = env.start_daemon()
    wait_for(lambda: any(e["event"] == "placement.round" for e in logs(log)), "a round")
    threads = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid)
    assert threads, "the rounds run on a thread of their own"
    _signal_thread(proc.pid, threads[-1], signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert logs(log)[-1]["event"] == "placement.stopped"


def test_a_second_daemon_on_sqlite_waits_while_the_first_leads(sqlite_env: Env) -> None:
    env = sqlite_env
    first, first_log = env.start_daemon()
    wait_for(lambda: any(e["event"] == "placement.round" for e in logs(first_log)), "leader")
    _, second_log = env.start_daemon()
    wait_for(lambda: any(e["event"] == "placement.waiting" for e in logs(second_log)), "waiting")
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=20) == 0
    wait_for(lambda: any(e["event"] == "placement.round" for e in logs(second_log)), "takeover")


@pytest.mark.postgres
def test_on_postgres_one_daemon_leads_and_another_takes_over_when_it_dies(pg_env: Env) -> None:
    env = pg_env
    env.llmgw("nodes", "report", env.write("nodes.yaml", NODES))
    (a, a_log), (b, b_log) = env.start_daemon(), env.start_daemon()

    def leaders() -> list[Path]:
        return [
            log for log in (a_log, b_log) if any(e["event"] == "placement.round" for e in logs(log))
        ]

    def waiting() -> list[Path]:
        return [log for log in (a_log, b_log) if _said(log, "placement.waiting")]

    # Both up, one leading and one waiting (not a fixed sleep: on a busy machine
    # the second process may take seconds just to start).
    wait_for(lambda: len(leaders()) >= 1 and len(waiting()) >= 1, "one leader, one waiting")
    wait_for(lambda: rounds(leaders()[0]) >= 3, "several rounds of the leader")
    assert len(leaders()) == 1
    leader = a if leaders() == [a_log] else b
    follower_log = b_log if leader is a else a_log
    assert any(e["event"] == "placement.waiting" for e in logs(follower_log))

    leader.send_signal(signal.SIGKILL)
    leader.wait(timeout=10)
    env.llmgw("add", env.write("m.yaml", _model("qwen", 3)))
    wait_for(lambda: len(env.placements()) == 3, "the follower to take over and place")
    assert any(e["event"] == "placement.leadership" and e["leading"] for e in logs(follower_log))


@pytest.mark.postgres
def test_the_daemon_survives_an_unreachable_database_without_duplicating(pg_env: Env) -> None:
    env = pg_env
    database = env.url.rsplit("/", 1)[1]
    env.llmgw("nodes", "report", env.write("nodes.yaml", NODES))
    env.llmgw("add", env.write("a.yaml", _model("first", 2)))
    proc, log = env.start_daemon()
    wait_for(lambda: len(env.placements()) == 2, "the first model to be placed")

    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (database,),
        )
        wait_for(
            lambda: any(e["event"] == "placement.round_failed" for e in logs(log)),
            "the daemon to notice the outage",
        )
        assert proc.poll() is None, "the daemon keeps running through the outage"
        admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')

    env.llmgw("nodes", "report", "nodes.yaml")
    env.llmgw("add", env.write("b.yaml", _model("second", 1)))
    wait_for(lambda: len(env.placements()) == 3, "the daemon to resume and place")
    seen = rounds(log)
    wait_for(lambda: rounds(log) >= seen + 3, "a few more rounds")
    placements = env.placements()
    assert sorted((p["model"], p["replica"]) for p in placements) == [
        ("first", 0),
        ("first", 1),
        ("second", 0),
    ]
    history = [e for e in logs(log) if e["event"] == "placement.placed"]
    assert len(history) == 3, "each replica was placed once, across the outage"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0


def _epochs(url: str) -> dict[int, set[str]]:
    """Which holders wrote rounds under each epoch of the leadership lease."""
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain) as conn:
        rows = conn.execute("SELECT epoch, leader FROM placement_rounds").fetchall()
    found: dict[int, set[str]] = {}
    for epoch, leader in rows:
        found.setdefault(epoch, set()).add(leader)
    return found


@pytest.mark.postgres
def test_on_postgres_a_frozen_leader_is_replaced_within_its_lease_and_writes_nothing_after(
    pg_env: Env,
) -> None:
    env = pg_env
    env.llmgw("nodes", "report", env.write("nodes.yaml", NODES))
    env.llmgw("add", env.write("a.yaml", _model("first", 1)))
    (a, a_log), (b, b_log) = env.start_daemon(), env.start_daemon()

    def holder(log: Path) -> str | None:
        taken = [e for e in logs(log) if e["event"] == "leadership.lease_acquired"]
        return str(taken[-1]["holder"]) if taken else None

    wait_for(lambda: len(env.placements()) == 1, "a leader to place the first model")
    # The leader is whoever holds the lease now: on a starved machine a leader that
    # could not renew in time loses it to the other before the freeze (as it should),
    # so neither "the first to log an acquisition" nor "only one ever held it" holds.
    current = eventually(lambda: _live_lease(env), "a lease held and not lapsed", 30)
    old = str(current["holder"])
    leader, leader_log = (a, a_log) if holder(a_log) == old else (b, b_log)
    follower_log = b_log if leader is a else a_log
    assert holder(leader_log) == old and holder(follower_log) != old
    frozen_at = int(current["epoch"])
    lost_before = _losses(leader_log)

    leader.send_signal(signal.SIGSTOP)  # frozen, not dead: its connections stay open
    try:
        env.llmgw("add", env.write("b.yaml", _model("second", 1)))
        wait_for(lambda: len(env.placements()) == 2, "the follower to take over and place")
        new = holder(follower_log)
        assert new is not None and new != old
        status = json.loads(env.llmgw("status", "--json").stdout)["leader"]
        assert status["holder"] == new and not status["lapsed"]
        _one_writer_per_epoch(env.url, old, new, frozen_at)
    finally:
        leader.send_signal(signal.SIGCONT)
    # Awake, the old leader learns it lost the lease and writes nothing more.
    wait_for(lambda: _losses(leader_log) > lost_before, "the old leader to step down")
    env.llmgw("add", env.write("c.yaml", _model("third", 1)))
    wait_for(lambda: len(env.placements()) == 3, "the new leader to place the third")
    _one_writer_per_epoch(env.url, old, new, frozen_at)
    assert not any(
        e["event"] == "placement.round"
        for e in logs(leader_log)[_resumed_at(leader_log, lost_before) :]
    ), "the old leader ran a round after waking"


def _live_lease(env: Env) -> dict[str, Any] | None:
    lease = json.loads(env.llmgw("status", "--json").stdout)["leader"]
    return lease if "holder" in lease and not lease["lapsed"] else None


def _one_writer_per_epoch(url: str, old: str, new: str, frozen_at: int) -> None:
    """Every epoch's rounds were written by one holder; from the epoch the old leader
    was frozen in, its rounds all come before the new leader's."""
    epochs = _epochs(url)
    assert all(len(holders) == 1 for holders in epochs.values()), epochs
    by = {e: next(iter(holders)) for e, holders in epochs.items() if e >= frozen_at}
    assert set(by.values()) <= {old, new} and new in by.values(), by
    olds = [e for e, h in by.items() if h == old]
    assert not olds or max(olds) < min(e for e, h in by.items() if h == new), by


def _losses(log: Path) -> int:
    return sum(e["event"] == "leadership.lease_lost" for e in logs(log))


def _resumed_at(log: Path, lost_before: int) -> int:
    """The index of the old leader's first log line after it learnt it lost the lease
    to the freeze (``lost_before``: the losses it had logged before, to load)."""
    lost = [i for i, e in enumerate(logs(log)) if e["event"] == "leadership.lease_lost"]
    return lost[lost_before]
