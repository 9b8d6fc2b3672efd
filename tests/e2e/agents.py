"""A cluster on loopback for the agent's tests: a real `llmgw serve`, real `llmgw agent`
processes (one per node name) and the sim engines they start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from agent.processes import same_process
from tests import forkserver
from tests.api.server import LLMGW, ApiServer, Tokens, _readline
from tests.e2e.cli import Cli
from tests.polling import poll_interval

T = TypeVar("T")

SIM = {
    "name": "chat",
    "source": "sim/chat",
    "scaling": {"min": 3},
    "profiles": [
        {"name": "sim", "engine": "sim", "gpu_class": "SIM", "args": ["--startup-delay", "0.3"]}
    ],
}


def eventually(check: Callable[[], T | None], what: str, timeout: float = 90) -> T:
    """Poll ``check`` until it answers something truthy; fail saying what never happened.

    A bound on waiting for a condition, never on how fast it happens: on a busy
    machine the condition arrives later, not differently.

    Looks every 50 ms at first, then less often as the wait goes on, up to every 250 ms
    (``tests.polling.poll_interval``).
    """
    started = time.monotonic()
    deadline = started + timeout
    while True:
        value = check()
        if value:
            return value
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"never happened within {timeout}s: {what}")
        time.sleep(poll_interval(now - started))


class AgentProc:
    """`llmgw agent` for one node name, on loopback, with pretend cards (``--gpus SIM:2``)."""

    def __init__(
        self, workdir: Path, url: str, node: str, token: str, *args: str, gpus: str | None
    ) -> None:
        self.node = node
        self.state_dir = workdir / f"agent-{node}"
        self.token_file = workdir / f"{node}.token"
        self.token_file.write_text(token + "\n")
        self.log_path = workdir / f"agent-{node}-{time.monotonic_ns()}.log"
        self.argv = [
            LLMGW, "agent", "--server", url, "--token-file", str(self.token_file),
            "--node", node, "--interval", "0.2", "--state-dir", str(self.state_dir),
            "--engine-host", "127.0.0.1", "--advertise", "127.0.0.1", "--stop-grace", "5",
            "--restart-backoff", "600", *args,
        ]  # fmt: skip
        if gpus is not None:
            self.argv += ["--gpus", gpus]
        # DEBUG: each tick's agent.reconciled line lets a test see that ticks happened.
        self.env = {**os.environ, "LLMGW_LOG_LEVEL": "DEBUG"}
        self.proc: forkserver.Forked | subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> AgentProc:
        assert self.argv[0] == LLMGW, self.argv
        with self.log_path.open("wb") as stderr:  # the child keeps its own copy
            # Forked from an interpreter that has llmgw and the agent's modules imported
            # (tests/forkserver.py), as the suite's commands and servers are: the same
            # `llmgw agent` (main, arguments, environment, output, signals, exit status),
            # without ~0.3 s of CPU of imports. A fresh process with LLMGW_TEST_FORK=0,
            # or when ``env`` sets a PYTHON* variable (the NVML stand-in's PYTHONPATH).
            self.proc = forkserver.popen(
                self.argv[1:],
                cwd=os.getcwd(),
                env={**self.env, **(env or {})},
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        assert self.proc.stdout is not None
        line = _readline(self.proc.stdout, 60)
        assert "reporting to" in line, f"the agent did not start: {line!r}\n{self.log_text()}"
        return self

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()

    def records(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted((self.state_dir / "engines").glob("*.json")):
            with suppress(OSError, ValueError):  # being replaced this instant
                out.append(json.loads(path.read_text()))
        return out

    def live_engines(self) -> list[dict[str, Any]]:
        return [
            r
            for r in self.records()
            if r["exited_at"] is None and same_process(r["pid"], r["start_time"], r["argv"])
        ]

    def kill_engines(self) -> None:
        for r in self.live_engines():
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(r["pid"], signal.SIGKILL)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def logs(self, event: str | None = None) -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in self.log_text().splitlines() if x.startswith("{")]
        return [x for x in lines if event is None or x.get("event") == event]


class Cluster:
    def __init__(self, workdir: Path, server: ApiServer, tokens: Tokens) -> None:
        self.workdir = workdir
        self.server = server
        self.tokens = tokens
        self.agents: dict[str, AgentProc] = {}
        self.cli = Cli(workdir, server.db_url)

    def agent(
        self,
        node: str,
        *args: str,
        gpus: str | None = "SIM:2",
        env: dict[str, str] | None = None,
    ) -> AgentProc:
        token = self.tokens.agents[node]
        proc = AgentProc(self.workdir, self.server.url, node, token, *args, gpus=gpus)
        self.agents[node] = proc
        return proc.start(env)

    def place(self) -> None:
        """One placement round, by the CLI, on the server's database."""
        done = self.cli("place")
        assert done.returncode == 0, done.stderr

    def placements(self) -> list[dict[str, Any]]:
        with self.server.client(self.tokens.reader) as c:
            answer = c.get("/v1/placements")
            assert answer.status_code == 200, answer.text
            return list(answer.json())

    def states(self) -> dict[tuple[str, int], dict[str, Any]]:
        return {(p["model"], p["replica"]): p for p in self.placements()}

    def ready(self, model: str, count: int) -> list[dict[str, Any]] | None:
        """The model's placements once ``count`` of them are ready with an endpoint."""
        ps = [p for p in self.placements() if p["model"] == model]
        ok = [p for p in ps if p["state"] == "ready" and p["endpoint"]]
        return ps if len(ps) == count and len(ok) == count else None

    def add(self, definition: dict[str, Any]) -> None:
        with self.server.client(self.tokens.operator) as c:
            answer = c.post("/v1/catalog/models", json=definition)
            assert answer.status_code == 201, answer.text

    def remove(self, name: str) -> None:
        with self.server.client(self.tokens.operator) as c:
            answer = c.delete(f"/v1/catalog/models/{name}")
            assert answer.status_code == 200, answer.text

    def close(self) -> None:
        for a in self.agents.values():
            a.stop(signal.SIGKILL)
        # Engines outlive a killed agent by design; the test must not leave any behind.
        for a in self.agents.values():
            a.kill_engines()
        self.server.stop()


@contextmanager
def cluster(
    workdir: Path,
    sqlite_url: str,
    nodes: list[str],
    *,
    server_args: list[str] | None = None,
    models: list[dict[str, Any]] | None = None,
) -> Iterator[Cluster]:
    tokens = Tokens.issue(agent_nodes=nodes)
    server = ApiServer(
        workdir,
        sqlite_url,
        tokens=tokens,
        args=server_args or [],
        declared={"models": models if models is not None else [SIM]},
    )
    server.start()
    c = Cluster(workdir, server, tokens)
    try:
        yield c
    finally:
        c.close()
