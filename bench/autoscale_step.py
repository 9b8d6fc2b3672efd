"""Time from a load step to the SLO met again, with real processes (see bench.autoscale).

A real ``llmgw serve --with-scheduler`` (placement rounds every 0.3 s, autoscale
interval 1 s), one ``llmgw agent`` with 8 pretend cards, and sim engines with a
startup delay. Signals are posted as a gateway would post them, every 0.5 s, from the
live ready count: one replica carries 2 concurrent requests within the SLO. At the step
the load goes from 1 to 8 concurrent: the SLO is met again once 4 replicas are ready.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from bench import common
from llmgw.api.auth import issue_token

LLMGW = str(Path(sys.executable).parent / "llmgw")
SETTINGS = """
[autoscale]
interval = "1s"
window = "3s"
target = 1.0
up_step = 4
up_cooldown = "1s"
down_cooldown = "5m"
default_capacity = 2
"""


def _catalog(delay: float) -> str:
    return f"""
models:
  - name: chat
    source: sim/chat
    scaling: {{min: 1, max: 4}}
    slo: {{ttft_p99: 1s}}
    profiles:
      - {{name: sim, engine: sim, gpu_class: SIM, args: ["--startup-delay", "{delay}"]}}
"""


def _ready(client: httpx.Client) -> tuple[int, int]:
    try:
        answer = client.get("/v1/placements")
    except httpx.TransportError:  # still starting, or busy: no answer is not an answer
        return -1, -1
    rows = [p for p in answer.json() if p["model"] == "chat"]
    return len(rows), sum(1 for p in rows if p["state"] == "ready" and p["endpoint"])


def _post(url: str, token: str, load: dict[str, float], stop: threading.Event) -> None:
    """What a gateway would post every half second, from the live ready count."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        while not stop.wait(0.5):
            _, ready = _ready(c)
            per = load["value"] / max(ready, 1)
            now = datetime.now(UTC)
            window: dict[str, Any] = {
                "model": "chat",
                "start": (now - timedelta(seconds=0.5)).isoformat(),
                "end": now.isoformat(),
                "requests": int(load["value"] * 10),
                "inflight_mean": load["value"],
                "ttft_p99_s": 0.2 if per <= 2 else 0.2 + per,
                "replicas": {
                    f"chat/{i}": {"requests": 1, "inflight_mean": per} for i in range(ready)
                },
            }
            c.post("/v1/signals", json={"gateway": "bench", "windows": [window]})


def _one_step(delay: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "llmgw.toml").write_text(SETTINGS)
        (work / "catalog.yaml").write_text(_catalog(delay))
        ops, agent = issue_token("ops", "operator"), issue_token("agent-n1", "agent", ["n1"])
        (work / "agent.token").write_text(agent.token)
        env = {
            **os.environ,
            "LLMGW_DATABASE_URL": f"sqlite:///{work}/llmgw.db",
            "LLMGW_TOKENS": ";".join(e.entry.to_env() for e in (ops, agent)),
            "LLMGW_LOG_LEVEL": "ERROR",
        }
        procs: list[subprocess.Popen[bytes]] = []
        try:
            serve = subprocess.Popen(
                [LLMGW, "serve", "--host", "127.0.0.1", "--port", "0", "--with-scheduler",
                 "--interval", "0.3"],
                cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            procs.append(serve)
            assert serve.stdout is not None
            line = serve.stdout.readline().decode()
            url = line.split("listening on ", 1)[1].strip()
            procs.append(
                subprocess.Popen(
                    [
                        LLMGW,
                        "agent",
                        "--server",
                        url,
                        "--token-file",
                        str(work / "agent.token"),
                        "--node",
                        "n1",
                        "--interval",
                        "0.2",
                        "--state-dir",
                        str(work / "agent"),
                        "--engine-host",
                        "127.0.0.1",
                        "--advertise",
                        "127.0.0.1",
                        "--gpus",
                        "SIM:8",
                    ],
                    cwd=work,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
            client = httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {ops.token}"}, timeout=30
            )
            deadline = time.monotonic() + 120
            while _ready(client) != (1, 1):
                assert time.monotonic() < deadline, "chat never had its first replica"
                time.sleep(0.1)
            load = {"value": 1.0}
            stop = threading.Event()

            poster = threading.Thread(target=_post, args=(url, ops.token, load, stop))
            poster.start()
            time.sleep(4)  # a window of the steady load first
            load["value"] = 8.0
            stepped = time.monotonic()
            placed_at = None
            while True:
                placed, ready = _ready(client)
                now = time.monotonic()
                if placed >= 4 and placed_at is None:
                    placed_at = now - stepped
                if ready >= 4:
                    met = now - stepped
                    break
                assert now - stepped < 180, "the SLO was never met again"
                time.sleep(0.05)
            stop.set()
            poster.join(10)
            client.close()
            return {"placed": placed_at or met, "met": met}
        finally:
            # The agent first: on SIGTERM it stops the engines it started (leave_engines
            # is off), then the server.
            for proc in reversed(procs):
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()


def step_table() -> common.Table:
    table = common.Table(
        "Autoscaling: a load step (1 -> 8 concurrent, 4 replicas needed) to the SLO met again",
        ["engine startup delay", "all 4 placed s", "SLO met again (4 ready) s"],
    )
    for delay in (0.5, 2.0):
        common.progress(f"autoscale: load step with startup delay {delay}s")
        found = _one_step(delay)
        table.add(f"{delay:g} s", f"{found['placed']:.2f}", f"{found['met']:.2f}")
    table.note(
        "autoscale interval 1 s, placement rounds every 0.3 s, signals every 0.5 s (posted "
        "as a gateway would: the gateway is not merged yet); the time includes the window "
        "catching the step, the decision, placement, the agent's start and the engine's delay"
    )
    return table
