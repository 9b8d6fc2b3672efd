"""A real ``llmgw serve`` process on a free loopback port, and HTTP clients for it."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from llmgw.api.guards.tokens import issue_token
from tests import forkserver
from tests.support import dump_yaml

LLMGW = str(Path(sys.executable).parent / "llmgw")
REPO = Path(__file__).resolve().parents[2]

DECLARED = {
    "models": [
        {
            "name": "base-7b",
            "aliases": ["base"],
            "source": "org/base-7b",
            "context_length": 32768,
            "max_output": 4096,
            "capabilities": {"tools": True},
            "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 1}],
        }
    ]
}


@dataclass
class Tokens:
    """One token per role, and an agent token per node (``agent`` reports node-0 and node-1)."""

    operator: str
    reader: str
    agent: str
    agents: dict[str, str] = field(default_factory=dict)
    env: str = ""
    # Gateway tokens by name (``gateways=`` of ``issue``).
    gateways: dict[str, str] = field(default_factory=dict)

    @classmethod
    def issue(cls, agent_nodes: Iterable[str] = (), gateways: Iterable[str] = ()) -> Tokens:
        ops = issue_token("ops", "operator")
        viewer = issue_token("viewer", "reader")
        agent = issue_token("agent-a", "agent", ["node-0", "node-1"])
        per_node = {n: issue_token(f"agent-{n}", "agent", [n]) for n in agent_nodes}
        per_gateway = {g: issue_token(g, "gateway") for g in gateways}
        entries = [ops, viewer, agent, *per_node.values(), *per_gateway.values()]
        return cls(
            operator=ops.token,
            reader=viewer.token,
            agent=agent.token,
            agents={n: t.token for n, t in per_node.items()},
            env=";".join(e.entry.to_env() for e in entries),
            gateways={g: t.token for g, t in per_gateway.items()},
        )


class ApiServer:
    def __init__(
        self,
        workdir: Path,
        db_url: str,
        *,
        tokens: Tokens | None = None,
        args: Iterable[str] = (),
        env: dict[str, str] | None = None,
        declared: dict[str, Any] | None = DECLARED,
    ) -> None:
        self.workdir = workdir
        self.db_url = db_url
        self.tokens = tokens
        self.args = list(args)
        self.env = {**os.environ, "LLMGW_DATABASE_URL": db_url, "LLMGW_LOG_LEVEL": "INFO"}
        for name in ("LLMGW_CONFIG", "LLMGW_AUTH_FILE", "LLMGW_TOKENS", "LLMGW_OPEN_READS"):
            self.env.pop(name, None)
        if declared is not None:
            config = workdir / "catalog.yaml"
            _write_declared(config, dump_yaml(declared))
            self.env["LLMGW_CONFIG"] = str(config)
        if tokens is not None:
            self.env["LLMGW_TOKENS"] = tokens.env
        self.env.update(env or {})
        self.log_path = workdir / f"serve-{time.monotonic_ns()}.log"
        self.proc: forkserver.Forked | subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 30) -> ApiServer:
        # The child holds its own copy of the log's descriptor: ours is closed at once
        # (left open, each server started leaked one until garbage collection).
        with self.log_path.open("wb") as log:
            # Forked from an interpreter that has llmgw imported (tests/forkserver.py):
            # the same `llmgw serve`, without ~1 s of CPU of imports.
            self.proc = forkserver.popen(
                ["serve", "--host", "127.0.0.1", "--port", "0", *self.args],
                cwd=self.workdir,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        assert self.proc.stdout is not None
        line = _readline(self.proc.stdout, timeout)
        if "listening on " not in line:
            self.stop()
            raise AssertionError(f"llmgw serve did not start: {line!r}\n{self.log_text()}")
        self.url = line.split("listening on ", 1)[1].strip()
        assert self.url.startswith("http://127.0.0.1:"), self.url
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"llmgw serve is not healthy:\n{self.log_text()}")
            time.sleep(0.05)

    def client(
        self, token: str | None = None, *, headers: dict[str, str] | None = None, **kwargs: Any
    ) -> httpx.Client:
        sent = {"Authorization": f"Bearer {token}"} if token else {}
        kwargs.setdefault("timeout", 30)
        return httpx.Client(base_url=self.url, headers={**sent, **(headers or {})}, **kwargs)

    def stop(self, timeout: float = 20) -> int | None:
        """SIGTERM, then wait; the exit status (None if it had to be killed)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def logs(self, event: str | None = None) -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in self.log_text().splitlines() if x.startswith("{")]
        return [x for x in lines if event is None or x.get("event") == event]


def _write_declared(path: Path, text: str) -> None:
    """Write the declared file whole (a new file renamed over it), and only if it changes.

    Servers sharing a work dir watch this file (declared.reload). Written in place, a
    server restarted beside running ones truncated it first: a running server that looked
    at that instant took an empty catalog, and for a moment dropped every declared model
    (the chaos test's gateways answered 404 "model 'chat' is not in the catalog").
    """
    if path.exists() and path.read_text() == text:
        return
    fresh = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fresh.write_text(text)
    os.replace(fresh, path)


@contextmanager
def running(server: ApiServer) -> Iterator[ApiServer]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _readline(stream: Any, timeout: float) -> str:
    selector = selectors.DefaultSelector()
    selector.register(stream, selectors.EVENT_READ)
    try:
        if not selector.select(timeout):
            return ""
        return str(stream.readline().decode())
    finally:
        selector.close()


def definition(name: str, **extra: Any) -> dict[str, Any]:
    """A small valid runtime model (one T4 replica at most)."""
    return {
        "name": name,
        "source": f"org/{name}",
        "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 1}],
        **extra,
    }


def sse_events(lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(id, data) of each SSE message in the lines of a streaming response, as they arrive."""
    event_id: int | None = None
    data: list[str] = []
    for line in lines:
        if line.startswith("id:"):
            event_id = int(line[3:].strip())
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            assert event_id is not None, "every message carries its position as id"
            yield event_id, json.loads("\n".join(data))
            event_id, data = None, []


def sse_messages(lines: Iterable[str]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(event name, id, data) of each SSE message, as they arrive; the name of an unnamed
    message is "message", as an EventSource calls it."""
    name, event_id, data = "message", "", []
    for line in lines:
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            yield name, event_id, json.loads("\n".join(data))
            name, event_id, data = "message", "", []
