"""Autoscaling through a real gateway: `llmgw serve --with-scheduler` (placement and the
autoscaler), two `llmgw agent`s running sim engines with ``--slots`` and
``--token-delay`` (latency grows with load as on a real engine), a real `llmgw gateway`
posting its signal windows, and clients on the official `openai` SDK.

Nothing here posts a signal: the windows the autoscaler decides from are the gateway's,
measured from the requests the clients send. Timings are short by settings (interval,
window, cooldowns, the gateway's ``signals_interval``); every wait is on a condition,
and the bounds only catch hangs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from autoscale.store import windows_t
from events.database.connection import make_engine
from tests.e2e.agents import Cluster, eventually
from tests.e2e.gateways import GatewayProc, gateway_cluster

pytestmark = pytest.mark.slow

# One replica carries 2 concurrent requests (its --slots); the policy knows it as the
# default capacity and aims at 0.75 of it: 4 clients need ceil(4 / 1.5) = 3 replicas.
SETTINGS = """
[autoscale]
interval = "1s"
window = "3s"
target = 0.75
up_step = 2
down_step = 2
up_cooldown = "1s"
down_cooldown = "4s"
default_capacity = 2

[gateway]
signals_interval = "0.5s"
"""
SLOTS = ["--slots", "2", "--token-delay", "0.05", "--startup-delay", "0.3"]
MAX_TOKENS = 16  # 0.8 s a request on a free slot
CHAT = {
    "name": "chat",
    "source": "sim/chat",
    "scaling": {"min": 1, "max": 4},
    "slo": {"ttft_p99": "3s", "tpot_p99": "1s"},
    "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM", "args": SLOTS}],
}
ZERO = {
    "name": "zero",
    "source": "sim/zero",
    "scaling": {"min": 0, "max": 1},
    "slo": {"ttft_p99": "3s"},
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
ROUNDS = ["--with-scheduler", "--interval", "0.3", "--stream-poll", "0.1"]


class Clients:
    """Closed-loop clients through the gateway, each one request at a time."""

    def __init__(self, gw: GatewayProc, token: str, model: str) -> None:
        self.gw, self.token, self.model = gw, token, model
        self.ok = 0
        self.failed: list[str] = []
        self.stops: list[threading.Event] = []
        self.threads: list[threading.Thread] = []

    def scale(self, n: int) -> None:
        while len(self.stops) > n:
            self.stops.pop().set()
        while len(self.stops) < n:
            stop = threading.Event()
            thread = threading.Thread(target=self._run, args=(stop,), daemon=True)
            self.stops.append(stop)
            self.threads.append(thread)
            thread.start()

    def _run(self, stop: threading.Event) -> None:
        client = self.gw.openai(self.token)
        while not stop.is_set():
            try:
                stream = client.chat.completions.create(
                    model=self.model,
                    messages=[{"role": "user", "content": "how many replicas?"}],
                    max_tokens=MAX_TOKENS,
                    stream=True,
                )
                text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                assert len(text.split()) == MAX_TOKENS, text
                self.ok += 1
            except Exception as exc:  # every failure is the test's finding
                self.failed.append(f"{type(exc).__name__}: {exc}"[:300])

    def close(self) -> None:
        self.scale(0)
        for t in self.threads:
            t.join(120)


@pytest.fixture
def running(tmp_path: Path, sqlite_url: str) -> Iterator[tuple[Cluster, GatewayProc, str]]:
    settings = tmp_path / "llmgw.toml"
    settings.write_text(SETTINGS)
    with gateway_cluster(
        tmp_path,
        sqlite_url,
        ["n1", "n2"],
        [CHAT, ZERO],
        ROUNDS,
        gateway_args=("--settings", str(settings)),
    ) as (c, gw, tokens):
        c.agent("n1", gpus="SIM:4")
        c.agent("n2", gpus="SIM:4")
        yield c, gw, tokens.client


def _count(c: Cluster, model: str, *, ready: bool = True) -> int:
    return sum(
        1 for p in c.placements() if p["model"] == model and (not ready or p["state"] == "ready")
    )


def _windows(c: Cluster, model: str) -> list[dict[str, Any]]:
    engine = make_engine(c.server.db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(windows_t).where(windows_t.c.model == model))
            return [dict(r) for r in rows.mappings()]
    finally:
        engine.dispose()


def test_a_load_step_scales_up_to_what_carries_it_then_down_to_min_and_zero_wakes(
    running: tuple[Cluster, GatewayProc, str],
) -> None:
    c, gw, token = running
    started = datetime.now(UTC) - timedelta(seconds=1)
    eventually(lambda: gw.ready("chat", 1), "chat has its one replica (scaling.min) at the gw")
    clients = Clients(gw, token, "chat")
    keys: set[str] = set()
    seen_max = 0

    def at(count: int) -> bool:
        nonlocal seen_max
        placements = [p for p in c.placements() if p["model"] == "chat"]
        keys.update(f"chat/{p['replica']}" for p in placements)
        seen_max = max(seen_max, len(placements))
        ready = [p for p in placements if p["state"] == "ready"]
        return len(ready) == count == len(placements) and gw.ready("chat", count)

    zero_answer: dict[str, Any] = {}

    def ask_zero() -> None:
        t0 = time.monotonic()
        try:
            answer = gw.openai(token).chat.completions.with_raw_response.create(
                model="zero", messages=[{"role": "user", "content": "wake"}], max_tokens=4
            )
            zero_answer["served_by"] = answer.headers["x-llmgw-replica"]
        except Exception as exc:
            zero_answer["error"] = repr(exc)[:300]
        zero_answer["seconds"] = time.monotonic() - t0

    try:
        # A step of load: 4 clients, 2 slots per replica at 0.75 of it: 3 replicas.
        clients.scale(4)
        eventually(lambda: at(3), "chat scaled up to 3 ready, at the gateway too", timeout=180)
        reached = datetime.now(UTC)
        # Within the SLO once they serve: a window after the move meets slo.ttft_p99.
        eventually(
            lambda: any(
                w["received_at"].replace(tzinfo=UTC) > reached
                and w["requests"] > 0
                and w["ttft_p99_s"] is not None
                and w["ttft_p99_s"] <= 3.0
                and len(json.loads(w["replicas"])) == 3
                for w in _windows(c, "chat")
            ),
            "a window served by the 3 replicas within the SLO",
            timeout=60,
        )
        # The load drops to one client (still served through the move): back to min.
        clients.scale(1)
        # Meanwhile a request for a model at zero replicas waits for one to start.
        assert _count(c, "zero", ready=False) == 0
        waker = threading.Thread(target=ask_zero, daemon=True)
        waker.start()
        eventually(lambda: at(1), "chat back to scaling.min (1)", timeout=180)
        waker.join(120)
        assert "error" not in zero_answer, zero_answer
        assert zero_answer["served_by"] == "zero/0"
        assert zero_answer["seconds"] < 60  # the profile's startup_timeout
        # Idle again (the gateway keeps reporting, with no zero traffic): back to 0.
        eventually(lambda: _count(c, "zero", ready=False) == 0, "zero idle again: 0", timeout=120)
    finally:
        clients.close()
    assert clients.ok > 0 and clients.failed == [], clients.failed[:5]
    assert seen_max <= 4  # never above scaling.max

    # What the gateway reported is what the control plane stored and decided from.
    served = [w for w in _windows(c, "chat") if w["requests"] > 0]
    # Who posted is the gateway token's name and the worker number (gw-1, one worker), not
    # the --gateway-id the gateway names itself with (issue 36: a token cannot pose as many).
    assert served and all(w["gateway"] == "gw-1-w0" and w["errors"] == 0 for w in served)
    untimed = [w for w in served if w["ttft_p99_s"] is None or w["tpot_p99_s"] is None]
    assert untimed == [], [
        (w["requests"], w["ttft_p99_s"], w["tpot_p99_s"], w["replicas"]) for w in untimed
    ]
    assert {k for w in served for k in json.loads(w["replicas"])} <= keys

    history = c.cli("autoscale", "history", "--json")
    assert history.returncode == 0, history.stderr
    decisions: list[dict[str, Any]] = json.loads(history.stdout)
    chat = [d for d in decisions if d["model"] == "chat"]
    # Up (in one or two steps as the load's window fills) to 3, never more, then down
    # to 1 (as the window empties): every move from the load the gateway measured.
    wanted = [d["wanted"] for d in chat]
    top = wanted.index(3)
    assert max(wanted) == 3 and wanted[-1] == 1, wanted
    assert wanted[: top + 1] == sorted(wanted[: top + 1]), wanted
    assert wanted[top:] == sorted(wanted[top:], reverse=True), wanted
    assert {d["code"] for d in chat} == {"load"}, chat
    assert all(d["inputs"]["summary"] is not None and d["reason"] for d in chat)
    zero = [(d["wanted"], d["code"]) for d in decisions if d["model"] == "zero"]
    assert zero == [(1, "waiting"), (0, "idle")], zero
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


# One slot a replica, 0.8 s a request: three clients keep two of them waiting in the
# gateway's queue, about 1 s each, above the model's slo.ttft_p99. The load (3 in
# flight) is far below what the default capacity says one replica carries: only the
# queue can scale it up.
QUEUE_SETTINGS = """
[autoscale]
interval = "1s"
window = "4s"
up_cooldown = "1s"
down_cooldown = "10m"
default_capacity = 100

[gateway]
signals_interval = "1s"
"""
QUEUED = {
    "name": "queued",
    "source": "sim/queued",
    "scaling": {"min": 1, "max": 2},
    "slo": {"ttft_p99": "500ms"},
    "profiles": [
        {
            "name": "sim",
            "engine": "sim",
            "gpu_class": "SIM",
            "args": ["--slots", "1", "--token-delay", "0.05"],
        }
    ],
}


def test_a_queue_that_grows_at_the_gateway_shows_in_the_autoscalers_decisions(
    tmp_path: Path, sqlite_url: str
) -> None:
    settings = tmp_path / "llmgw.toml"
    settings.write_text(QUEUE_SETTINGS)
    started = datetime.now(UTC) - timedelta(seconds=1)
    with gateway_cluster(
        tmp_path, sqlite_url, ["n1"], [QUEUED], ROUNDS, gateway_args=("--settings", str(settings))
    ) as (c, gw, tokens):
        c.agent("n1", gpus="SIM:4")
        eventually(lambda: gw.ready("queued", 1), "queued has its one replica at the gateway")
        clients = Clients(gw, tokens.client, "queued")
        try:
            clients.scale(3)
            eventually(
                lambda: _count(c, "queued") == 2 and gw.ready("queued", 2),
                "a second replica, asked for by the queue, ready at the gateway",
                timeout=120,
            )
        finally:
            clients.close()
        assert clients.ok > 0 and clients.failed == [], clients.failed[:5]
        history = c.cli("autoscale", "history", "--json")
        assert history.returncode == 0, history.stderr
        (up,) = [d for d in json.loads(history.stdout) if d["model"] == "queued"]
        assert (up["current"], up["wanted"], up["code"]) == (1, 2, "queue_wait"), up
        summary = up["inputs"]["summary"]
        assert summary["queue_wait_sustained_s"] > 0.5  # slo.ttft_p99
        assert summary["load"] < 100 * 0.7  # the load alone asked for no more
        assert "in two consecutive windows" in up["reason"]
        backtest = c.cli(
            "autoscale",
            "backtest",
            "--since",
            started.replace(tzinfo=None).isoformat(timespec="seconds"),
            "--json",
        )
        assert backtest.returncode == 0, backtest.stderr
        assert json.loads(backtest.stdout)["same_decisions"] is True
