"""`llmgw` commands and servers for the tests, forked from an interpreter that has
imported llmgw already, instead of started as a fresh interpreter each time.

Why: the suite runs about 450 `llmgw` commands and over a hundred `llmgw serve`, and
nearly all of a command's CPU (~0.5 s; ~1.2 s for `serve`) is importing SQLAlchemy,
pydantic, FastAPI and our packages; a fork costs milliseconds. What a test sees is
what the installed `llmgw` script gives: the same ``llmgw.cli.main`` with the same
arguments, environment, working directory, stdin/stdout/stderr, exit status and
signals, and the interpreter ends the same way (exit handlers run, streams flushed).
What it does not cover, the fresh interpreter's own start-up (the script, and a
command's imports in a new process), is held elsewhere: tests/unit/ops/test_cli_imports.py
(an agent, a gateway and a sim engine started fresh, each held to what it may import)
and test_forkserver.py run real processes, as every sim engine of the suite still is
(the agents start them). ``LLMGW_TEST_FORK=0`` runs every command as a real process.

One server per test worker (this file run as a script): it imports llmgw and the
libraries and command modules behind it, then for each request forks a waiter, which
forks the command and reports its pid, then its exit status, over the connection.
This module imports nothing of ours: the server starts as the installed script does
(``sys.path[0]`` the script's directory), not with the repository on its path.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

LLMGW = str(Path(sys.executable).parent / "llmgw")

# What most commands import: imported once in the server, so a forked command has them.
PRELOAD = (
    "sqlalchemy",
    "sqlalchemy.orm",
    "pydantic",
    "yaml",
    "structlog",
    "llmgw.logs",
    "llmgw.settings",
    "llmgw.cli.shared.context",
    "llmgw.cli.catalog.commands",
    "llmgw.cli.catalog.history",
    "llmgw.cli.catalog.audit",
    "llmgw.cli.scheduler.commands",
    "llmgw.cli.scheduler.explain",
    "llmgw.cli.scheduler.lifecycle",
    "llmgw.cli.operate.serve",
    "llmgw.cli.operate.status",
    "llmgw.api.app",
    "llmgw.api.server",
    # `llmgw agent` (tests/e2e/agents.py): what its command imports when it runs.
    "llmgw.cli.operate.agent",
    "llmgw.agent_settings",
    "agent.runtime",
    "agent.reconcile",
    "agent.client",
    "agent.inventory",
    "agent.state",
    "agent.binaries",
    # `llmgw gateway` (tests/e2e/gateways.py).
    "llmgw.cli.gateway.command",
    "llmgw.gateway_settings",
    "gateway.main",
)


def forks(env: Mapping[str, str]) -> bool:
    """Whether a command with ``env`` is forked: not with LLMGW_TEST_FORK=0, nor when it
    sets an interpreter's start-up variable (PYTHONPATH, ...) the server did not start
    with, which only a fresh interpreter would take."""
    if os.environ.get("LLMGW_TEST_FORK", "1") == "0":
        return False
    return _startup(env) == _startup(os.environ)


def _startup(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("PYTHON")}


# -- the server (this file run as a script) ----------------------------------------------


def serve(path: str, parent: int) -> None:
    # Before anything imports structlog, as `llmgw` itself does first (llmgw.cli.no_rich).
    from llmgw.cli import main, no_rich

    no_rich()
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)
    # What was imported, out of the collector's sight in every forked command (the
    # pre-fork recipe of gc.freeze's documentation). A fresh `llmgw serve` or gateway
    # collects once it has started (gc.collect, then gc.freeze): forked, that walked the
    # server's whole preloaded heap, about 0.1 s of CPU each, in 180-odd servers and
    # gateways a run; and any later full collection walked it again.
    import gc

    gc.collect()
    gc.freeze()
    listener = listening(path)
    listener.settimeout(0.5)
    # Stopped by the test worker at its end (SIGTERM): the commands still waited for are
    # reaped first. Each waiter waits for its command and the server for each waiter, so
    # their CPU adds up in the worker's, and the suite's, time as a real process's would.
    signal.signal(signal.SIGTERM, _stop)
    waiters: set[int] = set()
    try:
        while os.getppid() == parent:  # the test worker gone: so is its server
            _reap(waiters, block=False)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            pid = os.fork()
            if pid == 0:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                listener.close()
                _wait_for(conn, main)
            waiters.add(pid)
            conn.close()
    finally:
        _reap(waiters, block=True)


def listening(path: str) -> socket.socket:
    """A socket listening at ``path``, which appears only once it listens: the client
    waits for the path, and a connect between bind() and listen() is refused (seen once
    in CI, a busy 2-core machine, as four tests' ConnectionRefusedError). Bound under
    another name and renamed into place: a rename is atomic, and it moves the socket's
    file, which is what a connect finds."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    binding = f"{path}.binding"
    listener.bind(binding)
    listener.listen(64)
    os.rename(binding, path)
    return listener


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _reap(waiters: set[int], *, block: bool) -> None:
    for pid in list(waiters):
        if block:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # a command left running: ended with its waiter
        done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
        if done:
            waiters.discard(pid)


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, 8, 3)
    while len(head) < 8:
        head += conn.recv(8 - len(head))
    (size,) = struct.unpack("!Q", head)
    body = b""
    while len(body) < size:
        body += conn.recv(size - len(body))
    return json.loads(body), fds


def _wait_for(conn: socket.socket, main: Any) -> None:
    """The waiter: fork the command, say its pid, then its exit status. Never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        request, fds = _receive(conn)
        pid = os.fork()
        if pid == 0:
            conn.close()
            _run(request, fds, main)
        for fd in fds:
            os.close(fd)

        def _end(signum: int, frame: object) -> None:
            # The server ends its waiters at the worker's end: a command still running
            # then (one that did not take its stop: a daemon hung by SIGTERM, 2026-12-07)
            # would be left behind for good, holding its ports and its CPU.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os._exit(0)

        signal.signal(signal.SIGTERM, _end)
        conn.sendall(f"{pid}\n".encode())
        _, status, usage = os.wait4(pid, 0)
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        _note_cost(request, usage)
    finally:
        os._exit(0)


def _note_cost(request: dict[str, Any], usage: Any) -> None:
    """The command's CPU, its reaped children's included, for `scripts/suite-cost --commands`
    when LLMGW_TEST_COST_DIR is set in its environment (tests/suite_cost.py)."""
    directory = request["env"].get("LLMGW_TEST_COST_DIR")
    if not directory:
        return
    line = {
        "argv": request["argv"][:2],
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        # The test that started it (pytest sets this in the worker's environment).
        "test": request["env"].get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0],
    }
    with (
        contextlib.suppress(OSError),
        open(
            os.path.join(directory, f"commands-{os.getppid()}.jsonl"), "a", encoding="utf-8"
        ) as out,
    ):
        out.write(json.dumps(line) + "\n")


def _run(request: dict[str, Any], fds: list[int], main: Any) -> None:
    """The command, as the `llmgw` script runs it. Never returns."""
    code: Any = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        time.tzset()  # TZ is read when the interpreter starts
        sys.argv = [LLMGW, *request["argv"]]
        # Named for its command in ps and /proc (else every forked command shows as the
        # fork server): what a hung test's leftover process is, and the suite's CPU by kind.
        with open("/proc/self/comm", "w") as comm:
            comm.write(("llmgw " + (request["argv"] or ["?"])[0])[:15])
        try:
            code = main(request["argv"])
        except SystemExit as exc:
            code = exc.code
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        # How the interpreter ends on SystemExit(code): None is 0, a message goes to stderr.
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        import threading

        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, as at exit
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code if isinstance(code, int) else 1)


# -- the client (the tests) -----------------------------------------------------------------

_server: dict[str, Any] = {}


def _socket_path() -> str:
    if _server.get("pid") != os.getpid():
        where = tempfile.mkdtemp(prefix="llmgw-fork-")
        path = os.path.join(where, "sock")
        log = open(os.path.join(where, "server.log"), "wb")  # noqa: SIM115 (the server's)
        proc = subprocess.Popen(
            [sys.executable, __file__, path, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd=where,
        )
        log.close()
        deadline = time.monotonic() + 120
        while not os.path.exists(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the llmgw fork server did not start: see {where}/server.log")
            time.sleep(0.02)
        _server.update(pid=os.getpid(), path=path, proc=proc)
        atexit.register(_stop_server, proc)
    return str(_server["path"])


def _stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)  # waited for: its commands' CPU is counted in ours
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Forked:
    """A forked `llmgw` command, with the part of ``subprocess.Popen`` the tests use."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: str | os.PathLike[str],
        env: Mapping[str, str],
        stdout: int | IO[Any] | None = None,
        stderr: int | IO[Any] | None = None,
    ) -> None:
        self.args = [LLMGW, *argv]
        self.returncode: int | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        ends: list[int] = []
        mine: list[int] = []  # our copies of the child's ends, closed once sent
        for name, stream in (("stdin", subprocess.DEVNULL), ("stdout", stdout), ("stderr", stderr)):
            if stream == subprocess.PIPE:
                read, write = os.pipe()
                setattr(self, name, os.fdopen(read, "rb"))
                ends.append(write)
                mine.append(write)
            elif stream == subprocess.DEVNULL or stream is None:
                null = os.open(os.devnull, os.O_RDWR)
                ends.append(null)
                mine.append(null)
            else:
                assert not isinstance(stream, int)
                ends.append(stream.fileno())
        body = json.dumps({"argv": list(argv), "cwd": str(cwd), "env": dict(env)}).encode()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.connect(_socket_path())
            socket.send_fds(self._conn, [struct.pack("!Q", len(body))], ends)
            self._conn.sendall(body)
        finally:
            for fd in mine:
                os.close(fd)
        self._heard = b""
        pid = self._line(None)
        assert pid is not None, "the fork server did not start the command"
        self.pid = int(pid)

    def _line(self, timeout: float | None) -> bytes | None:
        """The next line the waiter sends; b"" if it ended without one, None on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._heard:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._conn], [], [], left)[0]:
                return None
            data = self._conn.recv(64)
            if not data:
                return b""
            self._heard += data
        line, self._heard = self._heard.split(b"\n", 1)
        return line

    def poll(self) -> int | None:
        return self._status(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            line = self._line(timeout)
            if line is None:
                return None
            # No status: the waiter was killed (the server ended); say so as a kill would.
            self.returncode = int(line) if line else -signal.SIGKILL
            self._conn.close()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def popen(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str],
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
) -> Forked | subprocess.Popen[bytes]:
    """``llmgw ARGV`` started in the background (a real process if LLMGW_TEST_FORK=0)."""
    if not forks(env):
        return subprocess.Popen(
            [LLMGW, *argv], cwd=cwd, env=dict(env), stdout=stdout, stderr=stderr
        )
    return Forked(argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr)


def run(
    argv: Sequence[str], *, cwd: str | os.PathLike[str], env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([llmgw, *argv], capture_output=True, text=True)``, forked."""
    if not forks(env):
        return subprocess.run(
            [LLMGW, *argv], cwd=cwd, env=dict(env), capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = Forked(argv, cwd=cwd, env=env, stdout=out, stderr=err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        texts = []
        for stream in (out, err):
            stream.seek(0)
            texts.append(_text(stream.read()))
    return subprocess.CompletedProcess([LLMGW, *argv], code, texts[0], texts[1])


def _text(data: bytes) -> str:
    # As subprocess's text mode reads a pipe: the locale's encoding, universal newlines.
    return io.TextIOWrapper(io.BytesIO(data)).read()


if __name__ == "__main__":
    # Started as the installed `llmgw` script is: its directory first on the path.
    sys.path[0] = os.path.dirname(LLMGW)
    serve(sys.argv[1], int(sys.argv[2]))
