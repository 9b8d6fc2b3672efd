"""A recorded autoscaling run on a real database, then backtested from what was stored.

The run is a closed loop, as on a cluster: at each 5 s tick a gateway's window is
posted to the store with latencies that follow the replicas the autoscaler asked for
(a replica carries 4 concurrent requests within the SLO; beyond that its p99 breaches),
then the autoscaler decides. A step of load (16 concurrent) and its removal.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from autoscale.policy import parse_policy
from autoscale.runner import Autoscaler
from autoscale.store import CAPACITY, AutoscaleStore
from autoscale.windows import ReplicaLoad, Window
from catalog import Catalog, Model
from catalog.definition.parse import parse_model
from events.database.connection import make_engine
from llmgw.cli.autoscale.commands import run_backtest
from tests.e2e.cli import Cli
from tests.support import dump_yaml, model

T0 = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
STEP = timedelta(seconds=5)
POLICY = parse_policy(
    {"interval": "5s", "window": "20s", "target": 0.75, "up_step": 2, "down_cooldown": "60s"}
)
EAGER = parse_policy(
    {"interval": "5s", "window": "20s", "target": 0.4, "up_step": 8, "down_cooldown": "60s"}
)
CHAT = model(
    "chat",
    profiles=[{"name": "main", "engine": "sim", "gpu_class": "SIM"}],
    scaling={"min": 1, "max": 8},
    slo={"ttft_p99": "1s", "tpot_p99": "100ms"},
)


def _load(at: datetime) -> float:
    minutes = (at - T0).total_seconds() / 60
    return 16.0 if 2 <= minutes < 6 else 1.0


def _window(at: datetime, replicas: int) -> Window:
    load = _load(at)
    per = load / max(replicas, 1)
    ttft = 0.2 if per <= 4 else 0.2 + (per - 4) * 0.5
    serving = {f"chat/{i}": ReplicaLoad(10, per, round(per) + 1) for i in range(replicas)}
    return Window(
        "gw-1", "chat", at - STEP, at, at, requests=int(load * 10), inflight_mean=load,
        inflight_max=round(load) + 1, ttft_p99_s=ttft, tpot_p99_s=0.03, replicas=serving,
    )  # fmt: skip


def _run(engine: Engine, minutes: int = 12, chat: Model = CHAT) -> AutoscaleStore:
    store = AutoscaleStore(engine)
    catalog = Catalog.build([chat])
    with engine.begin() as conn:
        store.append(conn, CAPACITY, "chat", {"profile": "main", "capacity": 4}, at=T0)
    scaler = Autoscaler(store, lambda: (catalog.models(), 1), POLICY)
    at = T0
    while at < T0 + timedelta(minutes=minutes):
        at += STEP
        wanted = store.state().get("chat")
        replicas = 1 if wanted is None else wanted.wanted
        w = _window(at - timedelta(milliseconds=500), replicas)
        store.record_signals("gw-1", [w], w.received_at)
        scaler.run(at)
    return store


def test_a_load_step_scales_up_within_max_and_back_to_min_after_the_cooldown(
    engine: Engine,
) -> None:
    store = _run(engine)
    decisions = store.events(kinds=("autoscale.decision",))
    wanted = [e.body["wanted"] for e in decisions]
    assert max(wanted) == 6  # 16 / (0.75 x 4) = 5.3: six carry it at the target share
    assert all(1 <= w <= 8 for w in wanted)
    assert wanted[-1] == 1  # back to min once the load is gone
    ups = [e for e in decisions if e.body["action"] == "up"]
    assert all(e.body["wanted"] - e.body["current"] <= 2 for e in ups)  # up_step
    downs = [e for e in decisions if e.body["action"] == "down"]
    first_down = downs[0].recorded_at
    assert first_down - ups[-1].recorded_at >= timedelta(seconds=60)  # down_cooldown
    # Each decision carries its inputs: the window summary, the limits, the policy.
    inputs = ups[0].body["inputs"]
    assert inputs["limits"]["capacity"] == 4 and inputs["limits"]["capacity_source"] == "bench"
    # The first window with the step in it: its mean load is past one replica's 0.75 x 4.
    assert inputs["summary"]["load"] > 3 and inputs["policy"]["target"] == 0.75
    assert ups[0].body["reason"].startswith("up 1 -> ") and ups[0].body["code"] == "load"


def test_the_backtest_with_the_policy_that_ran_reproduces_every_recorded_decision(
    engine: Engine,
) -> None:
    store = _run(engine)
    result = run_backtest(store, T0, T0 + timedelta(minutes=12), None, "recorded")
    recorded, replayed = result.models["chat"]
    assert len(recorded.decisions) >= 4
    assert recorded.decisions == replayed.decisions
    assert result.same
    assert recorded.replica_seconds == replayed.replica_seconds
    assert recorded.breached == replayed.breached
    # From the middle of the run, it starts from the state recorded there.
    middle = run_backtest(store, T0 + timedelta(minutes=4), T0 + timedelta(minutes=12), None, "r")
    assert middle.same and middle.models["chat"][0].decisions


def test_a_more_eager_policy_gives_more_replica_hours_and_fewer_breached_windows(
    engine: Engine,
) -> None:
    store = _run(engine)
    result = run_backtest(store, T0, T0 + timedelta(minutes=12), EAGER, "eager")
    recorded, replayed = result.models["chat"]
    assert not result.same
    assert replayed.replica_seconds > recorded.replica_seconds
    assert replayed.breached < recorded.breached
    assert recorded.breached > 0


PINNED: dict[str, Any] = {
    "name": "chat",
    "source": "org/chat",
    "profiles": [{"name": "main", "engine": "sim", "gpu_class": "SIM"}],
    "scaling": {"min": 2, "max": 2},
    "slo": {"ttft_p99": "1s", "tpot_p99": "100ms"},
}


def test_a_backtest_where_min_equals_max_says_any_policy_is_a_no_op(
    sqlite_url: str, tmp_path: Path
) -> None:
    # It printed "0 / 0 decisions ... same decisions as recorded", as if the policy had
    # been tried and agreed: with scaling.min == scaling.max no policy can move a count.
    engine = make_engine(sqlite_url)
    try:
        _run(engine, minutes=2, chat=parse_model(PINNED))
    finally:
        engine.dispose()
    (tmp_path / "catalog.yaml").write_text(dump_yaml({"models": [PINNED]}))
    (tmp_path / "eager.toml").write_text(
        '[autoscale]\ninterval = "5s"\nwindow = "20s"\ntarget = 0.4\nup_step = 8\n'
    )
    cli = Cli(tmp_path, sqlite_url)
    span = ["--since", T0.isoformat(), "--until", (T0 + timedelta(minutes=2)).isoformat()]
    done = cli("autoscale", "backtest", *span, "--policy", "eager.toml")
    assert done.returncode == 0, done.stderr
    assert "any policy is a no-op" in done.stdout, done.stdout
    assert "same decisions as recorded" not in done.stdout
    out = cli.json("autoscale", "backtest", *span, "--policy", "eager.toml")
    assert out["models"]["chat"]["fixed"] is True


def test_autoscale_explain_rounds_seconds_for_humans_and_keeps_json_exact(
    sqlite_url: str, tmp_path: Path
) -> None:
    # It printed "ttft p99 0.0746024809999426".
    ttft = 0.0746024809999426
    engine = make_engine(sqlite_url)
    now = datetime.now(UTC)
    try:
        w = Window(
            "gw-1", "chat", now - STEP, now, now, requests=40, inflight_mean=1.0,
            inflight_max=2, ttft_p99_s=ttft, tpot_p99_s=0.0312345678, replicas={},
        )  # fmt: skip
        AutoscaleStore(engine).record_signals("gw-1", [w], now)
    finally:
        engine.dispose()
    (tmp_path / "catalog.yaml").write_text(dump_yaml({"models": [PINNED]}))
    cli = Cli(tmp_path, sqlite_url)
    done = cli("autoscale", "explain", "chat")
    assert done.returncode == 0, done.stderr
    assert "ttft p99 0.0746s, tpot p99 0.0312s (SLO 1s / 0.1s)" in done.stdout, done.stdout
    assert "0.0746024809999426" not in done.stdout
    assert cli.json("autoscale", "explain", "chat")["signals"]["ttft_p99_s"] == ttft


def test_a_queue_that_grows_scales_up_recorded_as_queue_wait_and_replays_the_same(
    engine: Engine,
) -> None:
    # Load 3: one replica carries it by its capacity (0.75 x 4), but its engine's slots
    # do not: the gateway's queue grows by 0.4 s a window until a second replica serves.
    store = AutoscaleStore(engine)
    catalog = Catalog.build([CHAT])
    with engine.begin() as conn:
        store.append(conn, CAPACITY, "chat", {"profile": "main", "capacity": 4}, at=T0)
    scaler = Autoscaler(store, lambda: (catalog.models(), 1), POLICY)
    at, queue = T0, 0.0
    for _ in range(10):  # less than down_cooldown after the change: no way back down
        at += STEP
        wanted = store.state().get("chat")
        replicas = 1 if wanted is None else wanted.wanted
        queue = queue + 0.5 if replicas == 1 else 0.05
        serving = {f"chat/{i}": ReplicaLoad(10, 3 / replicas, 2) for i in range(replicas)}
        w = Window(
            "gw-1", "chat", at - STEP, at, at - timedelta(milliseconds=500), requests=30,
            inflight_mean=3.0, inflight_max=4, queue_wait_p99_s=queue, ttft_p99_s=0.2,
            tpot_p99_s=0.03, replicas=serving,
        )  # fmt: skip
        store.record_signals("gw-1", [w], w.received_at)
        scaler.run(at)
    (up,) = store.events(kinds=("autoscale.decision",))
    assert (up.body["current"], up.body["wanted"], up.body["code"]) == (1, 2, "queue_wait")
    # Not at the first window above slo.ttft_p99 (1s: 1.5s), at the second (2s).
    summary = up.body["inputs"]["summary"]
    assert (summary["queue_wait_p99_s"], summary["queue_wait_sustained_s"]) == (2.0, 1.5)
    assert up.body["reason"] == "up 1 -> 2: queue wait p99 1.500s > 1s in two consecutive windows"
    assert up.recorded_at == T0 + 4 * STEP
    result = run_backtest(store, T0, at, None, "recorded")
    assert result.same and result.models["chat"][1].decisions == [
        (up.recorded_at, 1, 2, "queue_wait")
    ]
