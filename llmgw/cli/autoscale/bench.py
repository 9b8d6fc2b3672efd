"""``llmgw bench MODEL --gateway URL --token-file F``: one replica's capacity against the SLO.

The steps are run by ``autoscale.loadgen`` and judged by ``autoscale.steps``; this
module reads the model's SLO from the catalog, prints the table and the chart, and
with ``--record`` appends the capacity as an ``autoscale.capacity`` event.
"""

from __future__ import annotations

import argparse
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autoscale import steps
from autoscale.limits import model_limits
from autoscale.loadgen import Target, run_step
from autoscale.store import CAPACITY, AutoscaleStore
from catalog.forms.durations import parse_duration
from catalog.forms.text import shown
from llmgw.cli.shared.context import App, Refused, print_json
from llmgw.cli.shared.tables import table

MAX_TOKEN_FILE = 4096
MAX_CONCURRENCY = 1024


def read_token(path: Path) -> str:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_TOKEN_FILE + 1)
    except OSError as exc:
        raise Refused(f"{path}: cannot read the token file: {exc.strerror}") from None
    token = raw.decode("utf-8", "replace").strip()
    if not token or len(raw) > MAX_TOKEN_FILE or any(c.isspace() for c in token):
        raise Refused(f"{path}: expected one token on one line (as `llmgw token new` prints it)")
    return token


def cmd_bench(app: App, args: argparse.Namespace) -> int:
    catalog = app.service.catalog()
    model = catalog.resolve(args.model)
    if model is None:
        raise Refused(f"model {args.model!r} is not in the catalog; `llmgw models` lists them")
    limits = model_limits([model], {})[model.name]
    if not limits.ttft_p99_s and not limits.tpot_p99_s:
        raise Refused(
            f"model {model.name!r} declares no slo (slo.ttft_p99, slo.tpot_p99): a capacity is "
            "the load that meets them, so there is nothing to measure against; add an slo to "
            "its definition (catalog.yaml for a declared model, `llmgw apply` for a runtime one)"
        )
    profile = args.profile or (model.profiles[0].name if model.profiles else "")
    if model.profile(profile) is None:
        names = ", ".join(p.name for p in model.profiles)
        raise Refused(f"model {model.name!r} has no profile {profile!r} (it has: {names})")
    if not 1 <= args.start_concurrency <= args.max_concurrency <= MAX_CONCURRENCY:
        raise Refused(
            f"--start-concurrency {args.start_concurrency} and --max-concurrency "
            f"{args.max_concurrency} must satisfy 1 <= start <= max <= {MAX_CONCURRENCY}"
        )
    try:
        seconds = parse_duration(args.step_time).total_seconds()
    except ValueError as exc:
        raise Refused(f"--step-time: {exc}") from None
    if seconds <= 0:
        raise Refused("--step-time must be a positive duration, e.g. 10s")
    target = Target(args.gateway, read_token(args.token_file), model.name, args.max_tokens)
    if args.record:
        _one_replica_placed(app, model.name)
    verdicts: list[steps.Verdict] = []
    replicas: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    for level in steps.schedule(args.start_concurrency, args.max_concurrency):
        result = run_step(target, level, seconds)
        replicas.update(result.replicas)
        errors.update(result.errors)
        verdicts.append(steps.judge(result.step, limits.ttft_p99_s, limits.tpot_p99_s))
        if not args.json:
            v = verdicts[-1]
            print(f"  concurrency {level}: {v.step.requests} requests, {shown(v.why)}", flush=True)
        if steps.should_stop(verdicts):
            break
    capacity = steps.capacity(verdicts)
    # Every step met up to the last one allowed: the capacity is at least that, not
    # measured (the load never found where the SLO breaks).
    capped = capacity > 0 and capacity == verdicts[-1].step.concurrency == max(
        steps.schedule(args.start_concurrency, args.max_concurrency)
    )
    data: dict[str, Any] = {
        "model": model.name,
        "profile": profile,
        "gateway": args.gateway,
        "slo": {"ttft_p99_s": limits.ttft_p99_s, "tpot_p99_s": limits.tpot_p99_s},
        "capacity": capacity,
        "capped": capped,
        "max_concurrency": args.max_concurrency,
        "steps": [v.to_json() for v in verdicts],
        "replicas_seen": dict(replicas),
        "errors": dict(errors),
        "recorded": False,
    }
    if args.record:
        if len(replicas) > 1:
            raise Refused(
                f"{len(replicas)} replicas served the bench ({', '.join(map(shown, replicas))}): "
                "a capacity is one replica's; scale the model to one replica (scaling.max: 1 "
                "while benching) and run it again. Nothing recorded."
            )
        if capacity <= 0:
            raise Refused(
                f"the first step (concurrency {verdicts[0].step.concurrency}) missed the SLO: "
                f"{verdicts[0].why}; nothing recorded (a capacity of 0 would stop all routing)"
            )
        store = AutoscaleStore(app.engine)
        with app.engine.begin() as conn:
            store.append(
                conn,
                CAPACITY,
                model.name,
                {"profile": profile, **{k: v for k, v in data.items() if k != "recorded"}},
                at=datetime.now(UTC),
                actor="llmgw bench",
            )
        data["recorded"] = True
    if args.json:
        print_json(data)
        return 0
    _print(data, verdicts, limits.ttft_p99_s)
    return 0


def _print(data: dict[str, Any], verdicts: list[steps.Verdict], slo: float | None) -> None:
    rows = [
        [
            str(v.step.concurrency),
            str(v.step.requests),
            str(v.step.errors),
            "-" if v.step.ttft_p99_s is None else f"{v.step.ttft_p99_s:.3f}s",
            "-" if v.step.tpot_p99_s is None else f"{v.step.tpot_p99_s:.4f}s",
            f"{v.step.rate:.1f}",
            "yes" if v.meets else "no",
        ]
        for v in verdicts
    ]
    print()
    print(
        table(
            ["concurrency", "requests", "errors", "ttft_p99", "tpot_p99", "req/s", "meets"], rows
        ),
        end="",
    )
    print(f"\nttft p99 per step (| is the SLO, {slo:g}s):" if slo else "\nttft p99 per step:")
    for line in steps.chart(verdicts, slo):
        print("  " + line)
    print(f"  trend {steps.sparkline([v.step.ttft_p99_s for v in verdicts])}")
    replicas = data["replicas_seen"]
    if len(replicas) > 1:
        print(
            f"warning: {len(replicas)} replicas served this bench; the figure is not one replica's"
        )
    least = "at least " if data["capped"] else ""
    print(
        f"\ncapacity of {shown(data['model'])} ({shown(data['profile'])}): {least}"
        f"{data['capacity']} concurrent requests within the SLO"
        + (" (recorded: routing weight and autoscaling use it)" if data["recorded"] else "")
    )
    if data["capped"]:
        print(
            f"capped by --max-concurrency {data['max_concurrency']}: every step met the SLO, "
            "so the replica's limit was not reached; raise --max-concurrency to measure it"
        )


def _one_replica_placed(app: App, model: str) -> None:
    """Refuse ``--record`` before any load when the model has more than one replica
    placed: the gateway would spread the bench over them, and a capacity is one
    replica's (the same check after the run catches one that started meanwhile)."""
    from scheduler.persistence.store import SchedulerStore

    placed = sorted(
        f"{p.model}/{p.replica} ({status.state})"
        for p, status in SchedulerStore(app.engine).replicas(model=model)
    )
    if len(placed) > 1:
        raise Refused(
            f"{len(placed)} replicas of model {shown(model)!r} are placed ({', '.join(placed)}): a "
            "capacity is one replica's, and the gateway would spread the bench over them; "
            "scale the model to one replica (scaling.max: 1 while benching) and run it "
            "again. Nothing run, nothing recorded."
        )
