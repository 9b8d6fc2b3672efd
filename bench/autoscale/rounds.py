"""``python -m bench autoscale``: what a decision round costs, and how fast a load step is met.

1. The CPU cost of one decision round (``autoscale.rounds.decide_round``: each model's
   summary and decision) with 1,000 models, each with 12 windows from 2 gateways (a
   minute of 5 s windows), half of them under load, a quarter breaching their SLO,
   summarising every window every round (written here from the definitions) against the
   running summaries (``autoscale.rolling``), interleaved. With ``LLMGW_BENCH_BASE=TREE``
   (a directory holding another version of the packages, see docs/benchmarks), the
   running summaries of that tree are measured too, in fresh processes alternating with
   this tree's: no old copy of product code is kept here.
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

import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from autoscale.decide import Last, Limits, decide
from autoscale.policy import parse_policy
from autoscale.rolling import Rolling
from autoscale.rounds import ModelState, decide_round
from autoscale.windows import EMPTY, ReplicaLoad, Summary, Window
from bench.shared import common

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


def _summarise_before(windows: list[Window]) -> Summary:
    """A model's summary from every one of its windows, one pass each round: the
    straightforward way, written from the definitions, that the running summaries
    (``autoscale.rolling``) are measured against."""
    weighted: dict[str, list[float]] = {}
    count = requests = errors = waiting = inflight_max = replicas = 0
    queue = ttft = tpot = None

    def higher(a: float | None, b: float | None) -> float | None:
        return b if a is None or (b is not None and b > a) else a

    for w in windows:
        count += 1
        seconds = (w.end - w.start).total_seconds()
        acc = weighted.get(w.gateway)
        if acc is None:
            acc = weighted[w.gateway] = [0.0, 0.0, 0.0, 0.0]
        if seconds > 0:
            acc[0] += w.inflight_mean * seconds
            acc[1] += seconds
        acc[2] += w.inflight_mean
        acc[3] += 1
        requests += w.requests
        errors += w.errors
        waiting = max(waiting, w.waiting)
        inflight_max = max(inflight_max, w.inflight_max)
        replicas = max(replicas, w.replica_count)
        if w.requests > 0:
            queue = higher(queue, w.queue_wait_p99_s)
            ttft = higher(ttft, w.ttft_p99_s)
            tpot = higher(tpot, w.tpot_p99_s)
    load = 0.0
    for total, seconds, plain, n in weighted.values():
        load += total / seconds if seconds > 0 else plain / n
    return Summary(count, len(weighted), requests, errors, waiting, round(load, 6),
                   inflight_max, replicas, queue, ttft, tpot)  # fmt: skip


def _before_round(limits: dict[str, Limits], windows: list[Window]) -> float:
    """The whole round as it was: group, summarise every model's windows, decide. CPU ms."""
    state = {m: ModelState(3, T0 - timedelta(minutes=10)) for m in limits}
    started = time.process_time()
    by_model: dict[str, list[Window]] = {}
    for w in windows:
        by_model.setdefault(w.model, []).append(w)
    for model, limit in limits.items():
        before = state[model]
        summary = _summarise_before(by_model[model]) if model in by_model else EMPTY
        decide(model, summary, before.wanted, limit, POLICY.for_model(model),
               last=Last(before.changed_at), now=T0)  # fmt: skip
    return (time.process_time() - started) * 1000


def _next_interval(windows: list[Window], k: int = 1) -> list[Window]:
    """The windows that arrive in the ``k``-th interval after ``T0``: the newest of each
    (model, gateway) repeated every 5 s, as the gateways go on reporting."""
    latest = [w for w in windows if w.received_at == T0]
    per = round(POLICY.interval / timedelta(seconds=5))
    out = []
    for j in range((k - 1) * per + 1, k * per + 1):
        shift = timedelta(seconds=5 * j)
        out += [replace(w, start=w.start + shift, end=w.end + shift, received_at=w.end + shift)
                for w in latest]  # fmt: skip
    return out


# Intervals folded before the one measured: the batch of the first full read has left by
# then (a 60 s window, 15 s intervals), as in a daemon that has run for a minute.
WARM = 5


def _cpu_round(
    limits: dict[str, Limits],
    windows: list[Window],
    arrivals: list[list[Window]],
    kind: type[Rolling],
) -> tuple[float, float, float, float, int]:
    """CPU ms of: folding the first interval after a full read in and out, folding one
    interval in and out in the steady state (``WARM`` intervals later), as the daemon
    reads them, then the round in that steady state (summaries from the running
    figures, maxima left stale by departures taken again, and decisions), and the
    decisions alone. ``kind``: the running summaries' class."""
    rolling = kind.of(windows)
    rolling.expire(T0 - POLICY.window)
    first = 0.0
    for k, arriving in enumerate(arrivals, start=1):
        at = T0 + POLICY.interval * k
        started = time.process_time()
        rolling.add(arriving)
        rolling.expire(at - POLICY.window)
        folding = (time.process_time() - started) * 1000
        if k == 1:
            first = folding
    state = {m: ModelState(3, T0 - timedelta(minutes=10)) for m in limits}
    started = time.process_time()
    decisions = decide_round(at, POLICY, limits, rolling, heard=True, state=state)
    whole = (time.process_time() - started) * 1000
    summaries = {m: _summarise_before(ws) for m, ws in _by_model(windows).items()}
    last = Last(T0 - timedelta(minutes=10))
    started = time.process_time()
    for model, limit in limits.items():
        decide(model, summaries.get(model), 3, limit, POLICY.for_model(model), last=last, now=T0)
    alone = (time.process_time() - started) * 1000
    return whole, first, folding, alone, sum(d.changes for d, _ in decisions)


def _by_model(windows: list[Window]) -> dict[str, list[Window]]:
    out: dict[str, list[Window]] = {}
    for w in windows:
        out.setdefault(w.model, []).append(w)
    return out


def _check_same(limits: dict[str, Limits], windows: list[Window]) -> int:
    """Models whose running summary differs from the one the old code made (rounding)."""
    rolling = Rolling.of(windows)
    return sum(rolling.summary(m) != _summarise_before(ws) for m, ws in _by_model(windows).items())


def _db_round(limits: dict[str, Limits], windows: list[Window]) -> tuple[float, float]:
    import tempfile

    from autoscale.runner import Autoscaler
    from autoscale.store import AutoscaleStore
    from catalog import Catalog, parse_model
    from events.database.connection import make_engine
    from events.database.migrate import upgrade

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


# One fresh process measures one tree's running summaries: that tree first on the path
# (a directory holding the packages, e.g. ``git archive COMMIT autoscale catalog``), this
# repository's bench after it. The tree's own ``bench`` is never used.
_WORKER = r"""
import json, sys
tree, size, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if tree:
    sys.path.insert(0, tree)
import autoscale
assert not tree or autoscale.__file__.startswith(tree), autoscale.__file__
from bench.autoscale.rounds import fold_figures
print(json.dumps(fold_figures(size, repeats)))
"""


def fold_figures(size: int, repeats: int) -> list[float]:
    """Medians of ``repeats`` runs of ``_cpu_round`` with the ``autoscale.rolling`` this
    process imports: round, first interval after a full read, one interval folded."""
    limits, windows = fleet(size)
    arrivals = [_next_interval(windows, k) for k in range(1, WARM + 2)]
    runs = [_cpu_round(limits, windows, arrivals, Rolling) for _ in range(repeats)]
    return [statistics.median(r[i] for r in runs) for i in range(3)]


def _in_fresh_process(tree: str | None, size: int, repeats: int) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-c", _WORKER, tree or "", str(size), str(repeats)],
        cwd=common.REPO,
        env={**os.environ, "PYTHONPATH": str(common.REPO)},
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if out.returncode != 0:
        raise SystemExit(f"autoscale: the worker for {tree or 'this tree'} failed:\n{out.stderr}")
    figures: list[float] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def base_table(base: str, sizes: list[int], quick: bool) -> common.Table:
    """The running summaries of another tree against this one's, alternating in fresh
    processes (``LLMGW_BENCH_BASE=TREE``), medians of the alternations."""
    table = common.Table(
        "Autoscaling: running summaries, the base tree against this one (CPU ms, fresh "
        "processes, alternating)",
        ["models", "round p50 ms, base / this", "folding one interval p50 ms, base / this",
         "first interval after a full read p50 ms, base / this"],
    )  # fmt: skip
    rounds = 3 if quick else 5
    for size in sizes:
        got: dict[str | None, list[list[float]]] = {base: [], None: []}
        for _ in range(rounds):  # base and this alternate: a busy moment slows both
            for tree in (base, None):
                common.progress(f"autoscale: {size:,} models{' (base)' if tree else ''}")
                got[tree].append(_in_fresh_process(tree, size, 3))
        med = statistics.median
        b, t = got[base], got[None]
        table.add(
            f"{size:,}",
            f"{med(r[0] for r in b):.2f} / {med(r[0] for r in t):.2f}",
            f"{med(r[2] for r in b):.2f} / {med(r[2] for r in t):.2f}",
            f"{med(r[1] for r in b):.2f} / {med(r[1] for r in t):.2f}",
        )
    table.note(f"base: {base}; each figure the median of {rounds} processes' medians of 3")
    return table


def run(quick: bool) -> list[common.Table]:
    sizes = [100, 1000] if quick else [100, 1000, 5000]
    cpu = common.Table(
        "Autoscaling: one decision round (pure), CPU ms, every window summarised against "
        "running summaries",
        ["models", "windows", "every window summarised: round p50 ms",
         "running summaries: round p50 ms", "folding one interval p50 ms",
         "first interval after a full read p50 ms", "round + folding p50 ms",
         "decide only p50 ms", "summaries that differ"],
    )  # fmt: skip
    for size in sizes:
        limits, windows = fleet(size)
        arrivals = [_next_interval(windows, k) for k in range(1, WARM + 2)]
        repeats = 5 if quick else 9
        runs = []
        for _ in range(repeats):  # interleaved: both ways share the machine's moods
            runs.append(
                (_before_round(limits, windows), _cpu_round(limits, windows, arrivals, Rolling))
            )
        med = statistics.median
        cpu.add(
            f"{size:,}",
            f"{len(windows):,}",
            f"{med(r[0] for r in runs):.2f}",
            f"{med(r[1][0] for r in runs):.2f}",
            f"{med(r[1][2] for r in runs):.2f}",
            f"{med(r[1][1] for r in runs):.2f}",
            f"{med(r[1][0] + r[1][2] for r in runs):.2f}",
            f"{med(r[1][3] for r in runs):.2f}",
            _check_same(limits, windows),
        )
    cpu.note(
        "target: under 10 ms for a round of 1,000 models (time.process_time, median); "
        "'every window summarised' summarises every model's 24 windows (2 gateways, a minute "
        "of 5 s windows) each round; 'running summaries' reads running figures kept by "
        "autoscale.rolling; 'folding one interval' is the work of keeping them for the 15 s "
        "between rounds (6 windows a model in, 6 out), done as the daemon reads the new "
        f"windows, measured {WARM} intervals after a full read (the steady state), and the "
        "first interval after a full read (the read's batches straddle the edge: what they "
        "keep is chunked again); 'decide only' is the decision function alone; "
        "'summaries that differ' counts models whose summary is not bit-identical to the "
        "per-window float summary's (integer sums round differently in the last place); "
        "LLMGW_BENCH_BASE=TREE adds another tree's running summaries beside these"
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
    base = os.environ.get("LLMGW_BENCH_BASE")
    if base:
        tables.insert(1, base_table(base, sizes, quick))
    if not quick:
        from bench.autoscale.step import step_table

        tables.append(step_table())
    return tables


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.autoscale.rounds", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, no load step")
    args = parser.parse_args(argv)
    common.quiet_logs()
    for table in run(quick=args.quick):
        common.emit(table)


if __name__ == "__main__":
    main()
