"""Autoscaling with real processes: `llmgw serve --with-scheduler`, two `llmgw agent`s, sim
engines, and the CLI.

No gateway yet (issue 26 is being built beside this): the test posts to
``POST /v1/signals`` what a gateway would post, every half second, with the replica
count taken from the live placements and latencies that follow from it (one replica
carries 2 concurrent requests within the SLO; more and its TTFT p99 breaches). So the
control loop is real (server, daemon, placement, agents, engines) and the signals are
a gateway's as this test models them. Real streamed requests run throughout against
the ready replicas' endpoints, retried on another replica when refused before any
byte was sent (as the gateway does): none may fail during the moves.

The gateway-driven version is ``test_autoscale_through_the_gateway`` (a follow-up,
once the gateway is merged).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from autoscale.loadgen import Target, _one
from tests.e2e.agents import Cluster, cluster, eventually

pytestmark = pytest.mark.slow

SETTINGS = """
[autoscale]
interval = "1s"
window = "3s"
target = 0.5
up_step = 2
up_cooldown = "1s"
down_cooldown = "4s"
default_capacity = 2
"""
SIM_ARGS = ["--startup-delay", "0.3", "--token-delay", "0.005"]
CHAT = {
    "name": "chat",
    "source": "sim/chat",
    "scaling": {"min": 1, "max": 4},
    "slo": {"ttft_p99": "1s", "tpot_p99": "200ms"},
    "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM", "args": SIM_ARGS}],
}
ZERO = {
    "name": "zero",
    "source": "sim/zero",
    "scaling": {"min": 0, "max": 2},
    "slo": {"ttft_p99": "1s"},
    "profiles": [
        {
            "name": "sim",
            "engine": "sim",
            "gpu_class": "SIM",
            "args": ["--startup-delay", "1"],
            "startup_timeout": "60s",
        }
    ],
}


class Gateway:
    """What a gateway would post: one window per model every half second."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.load = {"chat": 0.5, "zero": 0.0}
        self.waiting = {"chat": 0, "zero": 0}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            ready = self._ready()
            now = datetime.now(UTC)
            windows = []
            for model, load in self.load.items():
                replicas = ready.get(model, 0)
                per = load / max(replicas, 1)
                ttft = 0.1 if per <= 2 else 0.1 + per
                windows.append(
                    {
                        "model": model,
                        "start": (now - timedelta(seconds=0.5)).isoformat(),
                        "end": now.isoformat(),
                        "requests": round(load * 10),
                        "waiting": self.waiting[model],
                        "inflight_mean": load,
                        "inflight_max": round(load) + 1,
                        "ttft_p99_s": ttft if load else None,
                        "tpot_p99_s": 0.01 if load else None,
                        "replicas": {
                            f"{model}/{i}": {"requests": 1, "inflight_mean": per, "inflight_max": 1}
                            for i in range(replicas)
                        },
                    }
                )
            with self.c.server.client(self.c.tokens.operator) as client:
                answer = client.post("/v1/signals", json={"gateway": "test-gw", "windows": windows})
                assert answer.status_code == 202, answer.text

    def _ready(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.c.placements():
            if p["state"] == "ready" and p["endpoint"]:
                out[p["model"]] = out.get(p["model"], 0) + 1
        return out


class Traffic:
    """Real streamed requests to the ready replicas of a model, as a gateway would send."""

    def __init__(self, c: Cluster, model: str) -> None:
        self.c, self.model = c, model
        self.ok = 0
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        turn = 0
        while not self.stop.is_set():
            endpoints = [
                p["endpoint"]
                for p in self.c.placements()
                if p["model"] == self.model and p["state"] == "ready" and p["endpoint"]
            ]
            if not endpoints:
                time.sleep(0.1)
                continue
            turn += 1
            endpoint = endpoints[turn % len(endpoints)]
            url = urllib.parse.urlsplit(endpoint)
            conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
            target = Target(endpoint, "unused", self.model, max_tokens=8)
            try:
                _sample, error = _one(conn, "/v1/chat/completions", target, Counter())
            except ConnectionRefusedError:
                continue  # refused before a byte was sent: another replica (the gateway retries)
            except (OSError, http.client.HTTPException) as exc:
                error = repr(exc)
            finally:
                conn.close()
            if error:
                self.failed.append(f"{endpoint}: {error}")
            else:
                self.ok += 1


@pytest.fixture
def c(tmp_path: Path, sqlite_url: str) -> Iterator[Cluster]:
    (tmp_path / "llmgw.toml").write_text(SETTINGS)
    with cluster(
        tmp_path,
        sqlite_url,
        ["n1", "n2"],
        server_args=["--with-scheduler", "--interval", "0.3"],
        models=[CHAT, ZERO],
    ) as running:
        running.agent("n1", gpus="SIM:4")
        running.agent("n2", gpus="SIM:4")
        yield running


def _count(c: Cluster, model: str, *, ready: bool = True) -> int:
    return sum(
        1 for p in c.placements() if p["model"] == model and (not ready or p["state"] == "ready")
    )


def test_load_scales_up_within_max_then_back_to_min_and_zero_wakes_on_a_waiting_request(
    c: Cluster,
) -> None:
    started = datetime.now(UTC) - timedelta(seconds=1)
    eventually(lambda: _count(c, "chat") == 1, "chat has its one replica (scaling.min)")
    gateway, traffic = Gateway(c), Traffic(c, "chat")
    gateway.thread.start()
    traffic.thread.start()
    seen_max = 0

    def at(count: int) -> bool:
        nonlocal seen_max
        placed = _count(c, "chat", ready=False)
        seen_max = max(seen_max, placed)
        return _count(c, "chat") == count and placed == count

    try:
        # A step of load: 8 concurrent at 0.5 x 2 per replica wants 8; max is 4.
        gateway.load["chat"] = 8.0
        eventually(lambda: at(4), "chat scaled up to scaling.max (4 ready)", timeout=120)
        # The load goes: back to min, one step per down_cooldown.
        gateway.load["chat"] = 0.5
        eventually(lambda: at(1), "chat back to scaling.min (1)", timeout=120)
        assert seen_max <= 4 + 1  # max, plus at most one surge replica while replacing

        # Scale to zero and back: idle, then a request waits for it.
        assert _count(c, "zero", ready=False) == 0
        gateway.waiting["zero"] = 1
        eventually(lambda: _count(c, "zero") == 1, "zero woke with one replica", timeout=90)
        gateway.waiting["zero"] = 0
        endpoint = next(p["endpoint"] for p in c.placements() if p["model"] == "zero")
        url = urllib.parse.urlsplit(endpoint)
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
        _sample, error = _one(
            conn, "/v1/chat/completions", Target(endpoint, "x", "zero"), Counter()
        )
        conn.close()
        assert error is None
        eventually(lambda: _count(c, "zero", ready=False) == 0, "zero idle again: 0", timeout=90)
    finally:
        traffic.stop.set()
        gateway.stop.set()
        traffic.thread.join(30)
        gateway.thread.join(30)
    assert traffic.ok > 0 and traffic.failed == [], traffic.failed[:5]

    history = c.cli("autoscale", "history", "--json")
    assert history.returncode == 0, history.stderr
    decisions: list[dict[str, Any]] = json.loads(history.stdout)
    chat = [d for d in decisions if d["model"] == "chat"]
    assert max(d["wanted"] for d in chat) == 4 and chat[-1]["wanted"] == 1
    assert all(d["inputs"]["summary"] is not None and d["reason"] for d in chat)
    assert any(d["model"] == "zero" and d["code"] == "waiting" for d in decisions)
    status = c.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    rows = {r["model"]: r for r in json.loads(status.stdout)["models"]}
    assert rows["chat"]["wanted"] == 1 and rows["chat"]["max"] == 4
    backtest = c.cli(
        "autoscale",
        "backtest",
        "--since",
        started.replace(tzinfo=None).isoformat(timespec="seconds"),
        "--json",
    )
    assert backtest.returncode == 0, backtest.stderr
    assert json.loads(backtest.stdout)["same_decisions"] is True
