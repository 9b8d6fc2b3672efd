"""``python -m bench autoscale``: what a decision round costs, and how fast a load step is met.

1. The CPU cost of one decision round (``autoscale.rounds.decide_round``: summarise each
   model's windows and decide) with 1,000 models, each with 12 windows from 2 gateways
   (a minute of 5 s windows), half of them under load, a quarter breaching their SLO.
   Target: under 10 ms for the whole round. Timed with ``time.process_time`` (CPU,
   not wall: the machine is shared), median of repeats.
2. The round as the daemon runs it on SQLite (read the windows, decide, write the round
   and its events), same fleet: the I/O around the pure part, for scale.
3. Time from a load step to the SLO met again, with a real ``llmgw serve
   --with-scheduler``, an agent and sim engines (``--startup-delay``): the signals are
   posted as a gateway would post them (the gateway is not merged yet), with one replica
   carrying 2 concurrent requests within the SLO; the clock stops when enough replicas
   are ready for the step's load. Only without ``--quick``.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from autoscale.decide import Last, Limits, decide
from autoscale.policy import parse_policy
from autoscale.rounds import ModelState, decide_round, group
from autoscale.windows import ReplicaLoad, Window, summarise
from bench import common

T0 = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
POLICY = parse_policy({"interval": "15s", "window": "60s"})


def fleet(models: int, seed: int = 7) -> tuple[dict[str, Limits], list[Window]]:
    rng = random.Random(seed)
    limits: dict[str, Limits] = {}
    windows: list[Window] = []
    for i in range(models):
        name = f"model-{i:04d}"
        limits[name] = Limits(min=1, max=16, ttft_p99_s=1.0, tpot_p99_s=0.1, capacity=8)
        loaded = i % 2 == 0
        for gateway in ("gw-1", "gw-2"):
            for k in range(12):
                end = T0 - timedelta(seconds=5 * k)
                load = rng.uniform(4, 40) if loaded else rng.uniform(0, 1)
                windows.append(
                    Window(
                        gateway, name, end - timedelta(seconds=5), end, end,
                        requests=int(load * 20), inflight_mean=load, inflight_max=int(load) + 2,
                        ttft_p99_s=2.0 if i % 4 == 0 else 0.3, tpot_p99_s=0.05,
                        replicas={f"{name}/{r}": ReplicaLoad(10, load / 3, 3) for r in range(3)},
                    )
                )  # fmt: skip
    return limits, windows


def _cpu_round(limits: dict[str, Limits], windows: list[Window]) -> tuple[float, float, int]:
    """The whole round (summaries and decisions), and the decisions alone, CPU ms."""
    state = {m: ModelState(3, T0 - timedelta(minutes=10)) for m in limits}
    started = time.process_time()
    decisions = decide_round(T0, POLICY, limits, group(windows), heard=True, state=state)
    whole = (time.process_time() - started) * 1000
    summaries = {m: summarise(ws) for m, ws in group(windows).items()}
    last = Last(T0 - timedelta(minutes=10))
    started = time.process_time()
    for model, limit in limits.items():
        decide(model, summaries.get(model), 3, limit, POLICY.for_model(model), last=last, now=T0)
    alone = (time.process_time() - started) * 1000
    return whole, alone, sum(d.changes for d, _ in decisions)


def _db_round(limits: dict[str, Limits], windows: list[Window]) -> tuple[float, float]:
    import tempfile

    from autoscale.runner import Autoscaler
    from autoscale.store import AutoscaleStore
    from catalog import Catalog, parse_model
    from events.db import make_engine
    from events.migrate import upgrade

    models = [
        parse_model(
            {
                "name": name,
                "source": f"org/{name}",
                "profiles": [{"name": "p", "gpu_class": "A100"}],
                "scaling": {"min": 1, "max": 16},
                "slo": {"ttft_p99": "1s", "tpot_p99": "100ms"},
            }
        )
        for name in limits
    ]
    catalog = Catalog.build(models)
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{tmp}/bench.db")
        upgrade(engine)
        store = AutoscaleStore(engine)
        by_gateway: dict[str, list[Window]] = {}
        for w in windows:
            by_gateway.setdefault(w.gateway, []).append(w)
        for gateway, own in by_gateway.items():
            store.record_signals(gateway, own, T0 - timedelta(seconds=1))
        scaler = Autoscaler(store, lambda: (catalog.models(), 1), POLICY)
        started = time.perf_counter()
        scaler.run(T0)
        first = (time.perf_counter() - started) * 1000
        times = []
        latest = [w for w in windows if w.received_at == T0]
        for k in range(1, 6):
            at = T0 + POLICY.interval * k
            for gateway in by_gateway:
                fresh = [replace(w, received_at=at - timedelta(seconds=1)) for w in latest]
                store.record_signals(gateway, [w for w in fresh if w.gateway == gateway], at)
            started = time.perf_counter()
            scaler.run(at)
            times.append((time.perf_counter() - started) * 1000)
        engine.dispose()
    return first, statistics.median(times)


def run(quick: bool) -> list[common.Table]:
    sizes = [100, 1000] if quick else [100, 1000, 5000]
    cpu = common.Table(
        "Autoscaling: one decision round (pure), CPU ms",
        ["models", "windows", "round p50 ms", "per model us", "decide only p50 ms", "changes"],
    )
    for size in sizes:
        limits, windows = fleet(size)
        runs = [_cpu_round(limits, windows) for _ in range(5 if quick else 9)]
        median = statistics.median(t for t, _, _ in runs)
        cpu.add(
            f"{size:,}",
            f"{len(windows):,}",
            f"{median:.2f}",
            f"{median / size * 1000:.1f}",
            f"{statistics.median(a for _, a, _ in runs):.2f}",
            runs[0][2],
        )
    cpu.note(
        "target: under 10 ms for a round of 1,000 models (time.process_time, median); "
        "'decide only' is the decision function on summaries already made, the rest of the "
        "round summarises 24 windows a model (2 gateways, a minute of 5 s windows)"
    )
    db = common.Table(
        "Autoscaling: one round as the daemon runs it on SQLite (read, decide, write), wall ms",
        ["models", "first round (reads a minute of windows) ms", "next rounds p50 ms"],
    )
    limits, windows = fleet(1000)
    first, steady = _db_round(limits, windows)
    db.add("1,000", f"{first:.0f}", f"{steady:.0f}")
    db.note(
        "a next round reads only the windows received since the last (2,000 per 15 s here), "
        "decides every model and writes the round and one event per change"
    )
    tables = [cpu, db]
    if not quick:
        from bench.autoscale_step import step_table

        tables.append(step_table())
    return tables


def main() -> None:
    common.quiet_logs()
    for table in run(quick=False):
        common.emit(table)


if __name__ == "__main__":
    main()
