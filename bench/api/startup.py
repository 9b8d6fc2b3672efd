"""What starting each kind of process costs: CPU (user + system) of one start, to ready.

``python -m bench.api.startup [--rounds N] [--python PY ...]`` starts each kind ``N`` times
and prints the median CPU of a start (and the lowest), in a markdown table:

- ``llmgw --version`` and ``llmgw models`` (on a migrated SQLite file): a command;
- ``llmgw serve``: until ``/healthz`` answers, then SIGTERM;
- ``llmgw agent``: against a control plane that answers 403, so the agent does its
  whole start-up and first tick, then exits 1 on its own;
- ``llmgw gateway``: until it listens and has asked the control plane once, then SIGTERM;
- ``python -m agent.sim``: until ``/health`` answers, then SIGTERM.

A cluster starts an agent per node and an engine per replica, and the test suite starts
hundreds of these, so their start-up is most of the suite's CPU. Several ``--python``
(each a virtual environment's interpreter with llmgw installed, e.g. a worktree of the
commit before a change) are measured interleaved, round by round, so that a loaded
machine weighs on both alike. CPU, not wall time: it is what other work on the machine
does not change much. Only the standard library is used, so any commit's interpreter
can run this file.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

KINDS = ("--version", "models", "serve", "agent", "gateway", "sim")


class RefusingControlPlane:
    """Answers every request 403, as a control plane answers a token it will not take."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        asked = self.asked

        class Handler(http.server.BaseHTTPRequestHandler):
            def refuse(self) -> None:
                asked.set()
                self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.dumps({"title": "Forbidden", "status": 403, "detail": "no"})
                self.send_response(403)
                self.send_header("content-type", "application/problem+json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            do_GET = do_POST = do_PUT = refuse

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(url: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as r:
        return bool(r.status == 200)
    return False


def until(check: Callable[[], bool], proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 120
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what}: never ready (exit status {proc.poll()})")
        time.sleep(0.02)


def cpu_of(argv: list[str], env: dict[str, str], ready: Callable[[subprocess.Popen[bytes]], None]
           | None) -> float:  # fmt: skip
    """CPU seconds of one process run: to its end, or to ``ready`` and then SIGTERM."""
    # Run from the work directory: `-m` from a checkout would import that checkout's
    # code whichever interpreter runs it.
    proc = subprocess.Popen(
        argv, cwd=env["WORK"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    if ready is not None:
        ready(proc)
        proc.send_signal(signal.SIGTERM)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped by wait4
    return float(usage.ru_utime + usage.ru_stime)


def one(kind: str, python: str, work: Path, plane: RefusingControlPlane) -> float:
    llmgw = [python, "-m", "llmgw"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env["WORK"] = str(work)
    token = work / "token"
    if kind in ("--version", "models"):
        # Only the commands that read the catalog name a database: an agent, a gateway
        # and an engine run on nodes that have none.
        env["LLMGW_DATABASE_URL"] = f"sqlite:///{work / 'llmgw.db'}"
        return cpu_of([*llmgw, kind], env, None)
    if kind == "agent":
        argv = [*llmgw, "agent", "--server", plane.url, "--token-file", str(token),
                "--node", "n1", "--gpus", "SIM:2", "--state-dir", str(work / "agent")]  # fmt: skip
        return cpu_of(argv, env, None)
    port = free_port()
    if kind == "gateway":
        plane.asked.clear()
        argv = [*llmgw, "gateway", "--server", plane.url, "--token-file", str(token),
                "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip

        def listening(proc: subprocess.Popen[bytes]) -> None:
            until(lambda: plane.asked.is_set() and not port_free(port), proc, kind)

        return cpu_of(argv, env, listening)
    if kind == "serve":
        env["LLMGW_DATABASE_URL"] = f"sqlite:///{work / 'llmgw.db'}"
        argv = [*llmgw, "serve", "--host", "127.0.0.1", "--port", str(port)]
        health = f"http://127.0.0.1:{port}/healthz"
    else:
        argv = [python, "-m", "agent.sim", "--port", str(port), "--model", "m"]
        health = f"http://127.0.0.1:{port}/health"
    return cpu_of(argv, env, lambda proc: until(lambda: answers(health), proc, kind))


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.api.startup", description=__doc__)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--python", action="append", help="an interpreter with llmgw installed (repeatable)"
    )
    p.add_argument("--kinds", default=",".join(KINDS), help=f"of {','.join(KINDS)}")
    args = p.parse_args(argv)
    # Absolute, not resolved: a venv's python is a symlink to the base interpreter.
    pythons = [os.path.abspath(py) for py in args.python or [sys.executable]]
    kinds = args.kinds.split(",")
    plane = RefusingControlPlane()
    seen: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="llmgw-startup-") as tmp:
        works = {}
        for i, python in enumerate(pythons):
            work = works[python] = Path(tmp) / str(i)
            work.mkdir()
            (work / "token").write_text("not-a-real-token\n")
            # The schema first, so that `models` measures a read, not a migration.
            one("models", python, work, plane)
        for r in range(args.rounds):
            print(f"round {r + 1} of {args.rounds}", file=sys.stderr)
            for kind in kinds:
                for python in pythons:
                    cpu = one(kind, python, works[python], plane)
                    seen.setdefault((kind, python), []).append(cpu)
    print("| process | " + " | ".join(f"`{py}`" for py in pythons) + " |")
    print("|---|" + "---|" * len(pythons))
    for kind in kinds:
        cells = []
        for python in pythons:
            runs = seen[kind, python]
            cells.append(f"{statistics.median(runs):.3f} s (min {min(runs):.3f})")
        name = "python -m agent.sim" if kind == "sim" else f"llmgw {kind}"
        print(f"| `{name}` | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
