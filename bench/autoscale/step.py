"""Time from a load step to the SLO met again, through a real gateway (see bench.autoscale.rounds).

A real ``llmgw serve --with-scheduler`` (placement rounds every 0.3 s, autoscale
interval 1 s, window 3 s), one ``llmgw agent`` with 8 pretend cards running sim engines
with ``--slots 2 --token-delay 0.05`` and a startup delay, and a real ``llmgw gateway``
posting its signal windows every 0.5 s. Clients send streamed chat requests through the
gateway (``autoscale.loadgen``, the driver ``llmgw bench`` uses), 16 tokens each (0.8 s
on a free slot), and time each one's first token.

One client first; at the step, 8. One replica answers 2 at once, so 8 queue up to 3
answers deep (TTFT about 2.4 s against an SLO of 1 s) until 4 replicas serve. The
clock stops at the first request sent after the last one that missed the SLO: from
then on every request met it.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from autoscale.loadgen import Target, _one
from bench.shared import common
from llmgw.api.guards.tokens import issue_token

LLMGW = str(Path(sys.executable).parent / "llmgw")
SLO_S = 1.0
SETTINGS = """
[autoscale]
interval = "1s"
window = "3s"
target = 1.0
up_step = 4
up_cooldown = "1s"
down_cooldown = "5m"
default_capacity = 2

[gateway]
signals_interval = "0.5s"
"""


def _catalog(delay: float) -> str:
    return f"""
models:
  - name: chat
    source: sim/chat
    scaling: {{min: 1, max: 4}}
    slo: {{ttft_p99: {SLO_S:g}s}}
    profiles:
      - name: sim
        engine: sim
        gpu_class: SIM
        args: ["--slots", "2", "--token-delay", "0.05", "--startup-delay", "{delay}"]
"""


@dataclass
class Clients:
    """Closed-loop streamed requests through the gateway; (sent, ttft) of each answer."""

    target: Target
    samples: list[tuple[float, float]] = field(default_factory=list)
    failed: int = 0
    stops: list[threading.Event] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def scale(self, n: int) -> None:
        while len(self.stops) < n:
            stop = threading.Event()
            thread = threading.Thread(target=self._run, args=(stop,), daemon=True)
            self.stops.append(stop)
            self.threads.append(thread)
            thread.start()

    def _run(self, stop: threading.Event) -> None:
        url = urllib.parse.urlsplit(self.target.url)
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
        try:
            while not stop.is_set():
                sent = time.monotonic()
                sample, error = _one(conn, "/v1/chat/completions", self.target, Counter())
                if error or sample.ttft is None:
                    self.failed += 1
                    conn.close()
                    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
                else:
                    self.samples.append((sent, sample.ttft))
        finally:
            conn.close()

    def close(self) -> None:
        for stop in self.stops:
            stop.set()
        for thread in self.threads:
            thread.join(60)


def _start(argv: list[str], work: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, proc.stdout.readline().decode()


def _placements(client: httpx.Client) -> tuple[int, int]:
    try:
        rows = [p for p in client.get("/v1/placements").json() if p["model"] == "chat"]
    except (httpx.TransportError, ValueError):  # busy: no answer is not an answer
        return -1, -1
    return len(rows), sum(1 for p in rows if p["state"] == "ready" and p["endpoint"])


def _routed(gateway: str, token: str) -> int:
    try:
        auth = {"Authorization": f"Bearer {token}"}
        found = httpx.get(f"{gateway}/routing", headers=auth, timeout=10).json()["models"]
        found = found.get("chat")
    except (httpx.TransportError, ValueError, KeyError):
        return -1
    return -1 if found is None else len(found["replicas"])


def _processes(
    work: Path, env: dict[str, str], procs: list[subprocess.Popen[bytes]]
) -> tuple[str, str]:
    """The server, the agent and the gateway (appended to ``procs`` as they start)."""
    serve, line = _start(
        [LLMGW, "serve", "--host", "127.0.0.1", "--port", "0", "--with-scheduler",
         "--interval", "0.3"], work, env,
    )  # fmt: skip
    procs.append(serve)
    url = line.split("listening on ", 1)[1].strip()
    agent, _ = _start(
        [LLMGW, "agent", "--server", url, "--token-file", str(work / "agent.token"),
         "--node", "n1", "--interval", "0.2", "--state-dir", str(work / "agent"),
         "--engine-host", "127.0.0.1", "--advertise", "127.0.0.1", "--gpus", "SIM:8"],
        work, env,
    )  # fmt: skip
    procs.append(agent)
    gateway, line = _start(
        [LLMGW, "gateway", "--server", url, "--token-file", str(work / "gateway.token"),
         "--port", "0", "--gateway-id", "bench", "--settings", str(work / "llmgw.toml")],
        work, env,
    )  # fmt: skip
    procs.append(gateway)
    return url, line.split("listening on ", 1)[1].strip()


def _one_step(delay: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "llmgw.toml").write_text(SETTINGS)
        (work / "catalog.yaml").write_text(_catalog(delay))
        ops = issue_token("ops", "operator")
        agent = issue_token("agent-n1", "agent", ["n1"])
        gw_token, app = issue_token("gw-1", "gateway"), issue_token("app-1", "client")
        (work / "agent.token").write_text(agent.token)
        (work / "gateway.token").write_text(gw_token.token)
        env = {
            **os.environ,
            "LLMGW_DATABASE_URL": f"sqlite:///{work}/llmgw.db",
            "LLMGW_TOKENS": ";".join(e.entry.to_env() for e in (ops, agent, gw_token, app)),
            "LLMGW_LOG_LEVEL": "ERROR",
        }
        procs: list[subprocess.Popen[bytes]] = []
        clients: Clients | None = None
        try:
            url, gw_url = _processes(work, env, procs)
            client = httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {ops.token}"}, timeout=30
            )
            deadline = time.monotonic() + 120
            while _routed(gw_url, ops.token) != 1:
                assert time.monotonic() < deadline, "chat never had its first replica"
                time.sleep(0.1)
            clients = Clients(Target(gw_url, app.token, "chat", max_tokens=16))
            clients.scale(1)
            time.sleep(4)  # a window of the steady load first
            clients.scale(8)
            stepped = time.monotonic()
            placed_at = ready_at = None
            while ready_at is None:
                placed, _ = _placements(client)
                now = time.monotonic()
                if placed >= 4 and placed_at is None:
                    placed_at = now - stepped
                if _routed(gw_url, ops.token) >= 4:
                    ready_at = now - stepped
                assert now - stepped < 180, "4 replicas never served"
                time.sleep(0.05)
            time.sleep(3)  # requests sent once all four serve, to see the SLO held
            client.close()
            clients.close()
            after = [(sent, ttft) for sent, ttft in clients.samples if sent >= stepped]
            missed = [sent for sent, ttft in after if ttft > SLO_S]
            last_miss = max(missed, default=stepped)
            met = min((sent for sent, _ in after if sent > last_miss), default=last_miss)
            return {
                "placed": placed_at or ready_at,
                "ready": ready_at,
                "met": met - stepped,
                "worst": max((ttft for _, ttft in after), default=0.0),
                "failed": clients.failed,
            }
        finally:
            if clients is not None:
                clients.close()
            # The gateway, then the agent (on SIGTERM it stops the engines it started),
            # then the server.
            for proc in reversed(procs):
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()


def step_table() -> common.Table:
    table = common.Table(
        "Autoscaling: a load step (1 -> 8 concurrent through the gateway, 4 replicas "
        "needed) to the SLO met again",
        ["engine startup delay", "all 4 placed s", "4 serving at the gateway s",
         "SLO met again s", "worst TTFT s", "failed requests"],
    )  # fmt: skip
    for delay in (0.5, 2.0):
        common.progress(f"autoscale: load step with startup delay {delay}s")
        found: dict[str, Any] = _one_step(delay)
        table.add(
            f"{delay:g} s",
            f"{found['placed']:.2f}",
            f"{found['ready']:.2f}",
            f"{found['met']:.2f}",
            f"{found['worst']:.2f}",
            found["failed"],
        )
    table.note(
        "a real gateway posting every 0.5 s, autoscale interval 1 s and window 3 s, placement "
        "rounds every 0.3 s; 'SLO met again' is the send time, after the step, of the first "
        f"request after the last one whose TTFT missed the SLO ({SLO_S:g} s), as the clients "
        "measured it; the time includes the window catching the step, the decision, "
        "placement, the agent's start, the engine's delay and the gateway seeing it ready"
    )
    return table
