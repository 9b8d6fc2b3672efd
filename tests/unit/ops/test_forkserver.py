"""A forked `llmgw` (tests/forkserver.py, how the suite runs its commands and servers)
answers as the installed script run as a fresh process does: the same output, exit
status, environment, working directory and time zone."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests import forkserver
from tests.conftest import REPO


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    return {**env, "LLMGW_DATABASE_URL": f"sqlite:///{tmp_path / 'llmgw.db'}"}


def real(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [forkserver.LLMGW, *argv], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip


def write_model(where: Path) -> str:
    (where / "m.yaml").write_text(
        "name: tiny\nsource: org/tiny\nprofiles: [{name: t4, gpu_class: T4, tp: 1}]\n"
    )
    return "m.yaml"


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["frobnicate"],  # a usage error: 2, and argparse's text on stderr
        ["--db", "mysql+nosuchdriver://x/y", "models"],  # refused: 1, one line
        ["models", "--json"],
        ["settings", "--json"],  # the environment and the working directory, shown
        ["history", "--since", "12:00", "--json"],  # today, in the zone TZ names
    ],
    ids=" ".join,
)
def test_a_forked_command_answers_as_a_fresh_process(
    argv: list[str], tmp_path: Path, env: dict[str, str]
) -> None:
    env = {**env, "LLMGW_GRACE": "2h", "TZ": "Asia/Kolkata"}
    (tmp_path / "llmgw.toml").write_text('[policy]\nstale_after = "7s"\n')
    # A schema and an event in it; forked, as it is only the ground both runs stand on
    # (the comparison below is of ``argv``, forked and fresh).
    forkserver.run(["add", write_model(tmp_path)], cwd=tmp_path, env=env, timeout=300)
    forked = forkserver.run(argv, cwd=tmp_path, env=env, timeout=300)
    fresh = real(argv, tmp_path, env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )


def test_a_forked_server_stops_on_sigterm_as_a_real_one_does(
    tmp_path: Path, env: dict[str, str]
) -> None:
    argv = ["serve", "--host", "127.0.0.1", "--port", "0"]
    codes = []
    for forked in (True, False):
        proc: forkserver.Forked | subprocess.Popen[bytes]
        if forked:
            proc = forkserver.popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE)
        else:
            proc = subprocess.Popen(
                [forkserver.LLMGW, *argv], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
        assert proc.stdout is not None
        url = proc.stdout.readline().decode().split("listening on ", 1)[1].strip()
        deadline = time.monotonic() + 120  # a bound on a hang, not on speed
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                    break
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        codes.append(proc.wait(120))
        proc.stdout.close()
    assert codes == [0, 0]


def test_a_sigterm_right_after_the_listening_line_stops_serve(
    tmp_path: Path, env: dict[str, str]
) -> None:
    # Between printing its line and uvicorn's own handlers, serve's handler used to take
    # a SIGTERM and do nothing: the server then ran on. Now the stop is remembered and
    # honoured once the server has started. Sent at once, five times, forked (the
    # window is widest there: nothing left to import).
    argv = ["serve", "--host", "127.0.0.1", "--port", "0"]
    for _ in range(5):
        proc = forkserver.popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        assert "listening on " in proc.stdout.readline().decode()
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(60) == 0  # a bound on a hang, not on speed
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()


def test_the_servers_socket_appears_only_once_it_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client waits for the path and then connects: a path there before listen() is
    # a refused connect on a machine busy enough to run the client in that gap.
    path = str(tmp_path / "sock")
    seen_while_binding: list[bool] = []
    listen = socket.socket.listen

    def slow_listen(self: socket.socket, backlog: int = 0) -> None:
        seen_while_binding.append(os.path.exists(path))
        listen(self, backlog)

    monkeypatch.setattr(socket.socket, "listen", slow_listen)
    listener = forkserver.listening(path)
    try:
        assert seen_while_binding == [False]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
        assert sorted(os.listdir(tmp_path)) == ["sock"]
    finally:
        listener.close()


LEFT_RUNNING = """
import os, subprocess, sys
from tests import forkserver
proc = forkserver.popen(
    ["serve", "--host", "127.0.0.1", "--port", "0"], cwd=sys.argv[1], env=dict(os.environ),
    stdout=subprocess.PIPE,
)
proc.stdout.readline()  # listening
print(proc.pid, flush=True)
"""  # a test worker that ends with a command still running


def test_a_command_still_running_when_its_worker_ends_is_ended_with_it(
    tmp_path: Path, env: dict[str, str]
) -> None:
    # The fork server ends its waiters when the worker that started it ends; each waiter
    # ends its command. Before, the command was left behind for good (every server a
    # test forgot to stop, and a daemon hung by SIGTERM, kept running after the suite).
    worker = subprocess.run(
        [sys.executable, "-c", LEFT_RUNNING, str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert worker.returncode == 0, worker.stderr
    pid = int(worker.stdout.split()[-1])
    deadline = time.monotonic() + 60  # a bound on a leak, not on speed
    while os.path.exists(f"/proc/{pid}") and _state(pid) != "Z":
        assert time.monotonic() < deadline, f"the command {pid} outlived its worker"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
