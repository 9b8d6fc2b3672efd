"""Engine processes: start one, tell whether it still runs, stop it, read the end of its log.

Each engine gets a session (and so a process group) of its own: a Ctrl-C in
the agent's terminal does not reach it, the agent's death does not take it
down, and a stop signals the whole group, so an engine's own workers (vLLM
starts several) stop with it.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from agent.context import direct_opener
from agent.engines import Command
from agent.safefs import open_regular
from catalog.forms.printable import printable as is_printable

# The variable each engine is started with, holding its record's nonce: read back from
# /proc/PID/environ, it is what tells an engine this agent started from any other process.
NONCE_VAR = "LLMGW_ENGINE_NONCE"

# What a failed replica's message carries of its log.
TAIL_LINES = 5
TAIL_BYTES = 8192
MAX_MESSAGE = 800


@dataclass
class Engine:
    """A running engine: its pid and start time, and the Popen when this agent started it."""

    pid: int
    start_time: float
    argv: tuple[str, ...]
    popen: subprocess.Popen[bytes] | None = None

    def exit_status(self) -> tuple[bool, int | None]:
        """(exited, exit code). The code of an adopted engine is not ours to learn: None."""
        if self.popen is not None:
            code = self.popen.poll()
            return code is not None, code
        return not same_process(self.pid, self.start_time, self.argv), None


def free_port(host: str) -> int:
    with _socket(host) as s:
        s.bind((_bindable(host), 0))
        return int(s.getsockname()[1])


def port_free(host: str, port: int) -> bool:
    """Whether ``port`` can be listened on now (another process may take it after)."""
    with _socket(host) as s:
        try:
            s.bind((_bindable(host), port))
        except OSError:
            return False
        return True


def _socket(host: str) -> socket.socket:
    # An IPv6 literal (``::``, ``fd00::7``) is an address of that family: an IPv4
    # socket cannot bind it.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.socket(family, socket.SOCK_STREAM)


def _bindable(host: str) -> str:
    return "" if host in ("0.0.0.0", "::") else host


def url_host(host: str) -> str:
    """``host`` as a URL's host part: an IPv6 literal in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` or one of its descendants listens on TCP ``port``, and no
    other process does on an address that overlaps; None when that cannot be read
    (another user's process, no ``/proc``).

    What makes an answer on the port the engine's: the port is picked free and handed to
    the engine, and between the two any process on the machine may take it (another
    agent's engine, here and in CI: a ``/health`` answered by an engine serving another
    model). An engine that failed to bind exits, so its start fails instead of passing;
    but vLLM and llama.cpp bind with ``SO_REUSEPORT``, and beside another process of the
    same user that did too they bind and listen both, the kernel handing each
    connection to one or the other: the listeners not the engine's are looked for too.

    Read from the engine's network namespace's socket tables (``/proc/PID/net/tcp``,
    ``tcp6``: once each, where ``psutil``'s ``net_connections`` read them once per
    process) and the sockets its processes hold (``/proc/PID/fd``)."""
    try:
        root = psutil.Process(pid)
        if root.status() == psutil.STATUS_ZOMBIE:
            return False  # exited, not yet reaped: no sockets, no namespace to read
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return None
    try:
        listeners = _listeners(pid, port)
    except (FileNotFoundError, ProcessLookupError):
        return False  # gone since
    except OSError:
        return None
    if not listeners:
        return False
    ours: set[str] = set()
    unknown = False
    for proc in tree:
        try:
            ours |= _socket_inodes(proc.pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
        except PermissionError:
            unknown = True
    mine = [address for inode, address in listeners if inode in ours]
    others = [address for inode, address in listeners if inode not in ours]
    if not mine or (others and unknown):
        return None if unknown else False
    return not any(_overlap(a, b) for a in mine for b in others)


# A listening socket's state in /proc/net/tcp.
_LISTEN = "0A"


def _listeners(pid: int, port: int) -> list[tuple[str, str]]:
    """(inode, local address) of every TCP socket listening on ``port`` in the network
    namespace of ``pid`` (``OSError`` when its tables cannot be read: ``FileNotFoundError``
    once it is gone)."""
    suffix = f":{port:04X}"
    # (Looked for before a line is split: a host's tables may hold 100,000 sockets.)
    needle = suffix + " "
    out = []
    for table, v6 in (("tcp", False), ("tcp6", True)):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
                lines = f.read().splitlines()[1:]
        except FileNotFoundError:
            if v6 and os.path.exists(f"/proc/{pid}/net/tcp"):
                continue  # IPv6 is off
            raise
        for line in lines:
            if needle not in line:
                continue
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and fields[1].endswith(suffix):
                out.append((fields[9], _address(fields[1][: -len(suffix)], v6)))
    return out


def _address(hexed: str, v6: bool) -> str:
    """An address of /proc/net/tcp (32-bit words in the host's order), as text; an
    IPv4-mapped IPv6 address as its IPv4 one."""
    words = [int(hexed[i : i + 8], 16) for i in range(0, len(hexed), 8)]
    packed = struct.pack(f"={len(words)}I", *words)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, packed)
    if packed[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, packed[12:])
    return socket.inet_ntop(socket.AF_INET6, packed)


def _overlap(a: str, b: str) -> bool:
    """Whether a connection to one of two listening addresses may reach the other's
    socket: the same address, or a wildcard of its family (``::`` takes IPv4 too
    unless IPV6_V6ONLY, which the tables do not say)."""
    if a == b or "::" in (a, b):
        return True
    if ":" in a or ":" in b:
        return False
    return "0.0.0.0" in (a, b)


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds."""
    out = set()
    fds = f"/proc/{pid}/fd"
    for fd in os.listdir(fds):
        try:
            target = os.readlink(f"{fds}/{fd}")
        except (FileNotFoundError, ProcessLookupError):
            continue  # closed since
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def environ_value(pid: int, name: str) -> str | None:
    """The variable ``name`` in the environment process ``pid`` was started with; None
    when it has none or that cannot be read. The agent asks a keyed engine (its profile's
    ``VLLM_API_KEY: {secret: NAME}``) with the key it gave it, adopted engines included:
    the value is never kept in the agent's records."""
    try:
        return psutil.Process(pid).environ().get(name)
    except psutil.Error:
        return None


def open_log(log_path: Path) -> int:
    """The engine's log, for appending; never through a link (``agent.safefs``)."""
    return open_regular(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


# What an engine does not inherit of the agent's environment: the node's secrets
# (``LLMGW_SECRET_<NAME>``, agent.secrets). An engine runs code that came with its model
# (vLLM's trust_remote_code): it gets the secrets its profile names, resolved into
# ``cmd.env``, and no other.
SECRET_PREFIX = "LLMGW_SECRET_"


def engine_environment(cmd: Command, nonce: str) -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(SECRET_PREFIX)}
    return {**inherited, **cmd.env, NONCE_VAR: nonce}


def spawn(cmd: Command, log_path: Path, cwd: Path, nonce: str) -> Engine:
    env = engine_environment(cmd, nonce)
    out = open_log(log_path)
    try:
        popen = subprocess.Popen(
            cmd.argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        os.close(out)
    try:
        start_time = psutil.Process(popen.pid).create_time()
    except psutil.Error:
        start_time = 0.0  # it already exited; poll() says so on the next look
    return Engine(popen.pid, start_time, tuple(cmd.argv), popen)


START_TIME_TOLERANCE_S = 2.0


def same_process(pid: int, start_time: float, argv: Iterable[str]) -> bool:
    """Whether ``pid`` is still the process that was started then with that command line."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        # create_time is the process's clock ticks since boot plus the boot time, and the
        # boot time (/proc/stat btime) is the wall clock less the time since boot: it
        # moves by a second when the clock is adjusted, so the same process read twice
        # can differ by one (seen as a flaky test under load). The tolerance absorbs
        # that; a pid reused by the same command line within it is not a real case,
        # and adoption proves identity by the per-engine nonce anyway (``not_ours``).
        return abs(
            proc.create_time() - start_time
        ) < START_TIME_TOLERANCE_S and proc.cmdline() == list(argv)
    except psutil.Error:
        return False


def not_ours(pid: int, start_time: float, argv: Iterable[str], nonce: str) -> str | None:
    """Why the process ``pid`` is not the engine a record describes; None if it is.

    The pid, start time and command line are all a record could forge from
    ``ps``; the nonce is in the environment of the engines this agent started
    alone, and only the process's own user (or root) can read that.
    """
    if not nonce:
        return "the record carries no nonce (written by an older agent, or forged)"
    if not same_process(pid, start_time, argv):
        return "no process with that pid, start time and command line runs"
    try:
        proc = psutil.Process(pid)
        if proc.uids().real != os.getuid():
            return f"process {pid} belongs to uid {proc.uids().real}, not to this agent's user"
        found = proc.environ().get(NONCE_VAR)
    except psutil.AccessDenied:
        return f"the environment of process {pid} cannot be read by this agent"
    except psutil.Error:
        return f"process {pid} exited"
    if found != nonce:
        return f"process {pid} does not carry the record's nonce in its environment"
    return None


def stop(engines: Iterable[Engine], grace: float) -> dict[int, int | None]:
    """SIGTERM each engine's group, wait up to ``grace`` seconds, SIGKILL what is left.

    Signals go to all engines first, then one wait covers them all, so
    stopping ten engines takes one grace period, not ten.
    """
    engines = list(engines)
    for e in engines:
        _signal_group(e, signal.SIGTERM)
    deadline = time.monotonic() + grace
    pending = list(engines)
    while pending and time.monotonic() < deadline:
        pending = [e for e in pending if not e.exit_status()[0]]
        if pending:
            time.sleep(0.05)
    for e in pending:
        _signal_group(e, signal.SIGKILL)
    codes: dict[int, int | None] = {}
    for e in engines:
        if e.popen is not None:
            try:
                codes[e.pid] = e.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                codes[e.pid] = None
        else:
            codes[e.pid] = None
    return codes


def _signal_group(e: Engine, signum: signal.Signals) -> None:
    if e.exit_status()[0]:
        return
    try:
        os.killpg(e.pid, signum)  # the engine leads its own session: pgid == pid
    except ProcessLookupError:
        pass
    except PermissionError:
        # Not our process group any more (a reused pid): never signal a stranger.
        pass


def healthy(url: str, timeout: float = 1.0) -> bool:
    # Straight to the engine on this machine, never through an http_proxy the environment
    # may name for the control plane; the whole check within ``timeout``.
    try:
        with direct_opener(within=timeout).open(url, timeout=timeout) as answer:
            answer.read(1024)
            return 200 <= int(answer.status) < 300
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
        return False


def tail(log_path: Path, lines: int = TAIL_LINES) -> str:
    """The last lines of a log, as one printable line: reports are shown in terminals.

    Just after a rotation the log may hold less than that; its newest rotated
    copy (``NAME.1``) supplies the lines before.
    """
    data = _last_bytes(log_path.with_name(log_path.name + ".1")) + _last_bytes(log_path)
    kept = [printable(x) for x in data.splitlines() if x.strip()][-lines:]
    text = " | ".join(kept)
    return text if len(text) <= MAX_MESSAGE else "..." + text[-(MAX_MESSAGE - 3) :]


def _last_bytes(path: Path) -> str:
    # A link or a FIFO at a log's path gives nothing (agent.safefs): never another file.
    try:
        fd = open_regular(path, os.O_RDONLY)
    except OSError:
        return ""
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, TAIL_BYTES, max(0, size - TAIL_BYTES)).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def printable(text: str) -> str:
    # The control plane's rule (catalog.forms.printable, a fixed Unicode version), not this
    # Python's isprintable: a character a newer Python finds printable would otherwise
    # reach a report the server refuses whole.
    return "".join(c if is_printable(c) else "?" for c in text).strip()


def describe_exit(code: int | None) -> str:
    if code is None:
        return (
            "the engine exited (its exit code is unknown: this agent adopted it, "
            "it did not start it)"
        )
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the engine was killed by {name}"
    return f"the engine exited with code {code}"
