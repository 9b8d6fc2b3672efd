"""``llmgw status`` and ``llmgw autoscale history | explain | backtest``."""

from __future__ import annotations

import argparse
import tomllib
from datetime import UTC, datetime, timedelta
from typing import Any

from autoscale.backtest import Result, backtest
from autoscale.decide import Last, decide, queue_limit
from autoscale.limits import model_limits
from autoscale.policy import Policy, PolicyError, parse_policy
from autoscale.rolling import Rolling
from autoscale.rounds import judged_summary
from autoscale.store import DECISION, HOLD, AutoscaleStore, StoredEvent
from catalog import Catalog
from catalog.forms.text import shown
from llmgw.autoscale_view import autoscale_rows
from llmgw.cli.shared.context import App, Refused, parse_when, print_json
from llmgw.cli.shared.tables import table
from scheduler.persistence.store import SchedulerStore

# A policy file is a few hundred bytes, as the settings file is.
MAX_POLICY_BYTES = 64 * 1024


def _model(app: App, name: str) -> str:
    catalog = app.service.catalog()
    found = catalog.canonical(name)
    if found is None:
        raise Refused(
            f"model {name!r} is not in the catalog; `llmgw models` lists the names and aliases"
        )
    return found


def model_rows(app: App, catalog: Catalog, replicas: Any, now: datetime) -> list[dict[str, Any]]:
    """Per model: ready, placed, wanted, scaling.min..max and the autoscaler's view
    (``llmgw status``)."""
    return autoscale_rows(
        catalog, replicas, AutoscaleStore(app.engine), app.settings.autoscale, now
    )


def _p99(value: Any, slo: Any) -> str:
    if value is None:
        return "-"
    mark = "!" if slo and value > slo else ""
    return f"{value:.3f}s{mark}"


def status_table(rows: list[dict[str, Any]]) -> str:
    headers = ["model", "ready", "placed", "wanted", "min..max", "autoscale", "load"]
    headers += ["ttft_p99", "tpot_p99", "last decision"]
    body = []
    for r in rows:
        signals, slo, last = r["signals"], r["slo"], r["last_decision"]
        body.append(
            [
                r["model"],
                str(r["ready"]),
                str(r["placed"]),
                str(r["wanted"]),
                f"{r['min']}..{r['max']}",
                "on" if r["autoscaled"] else "off",
                "-" if signals is None else f"{signals['load']:.2f}/{r['capacity']:g}",
                "-" if signals is None else _p99(signals["ttft_p99_s"], slo["ttft_p99_s"]),
                "-" if signals is None else _p99(signals["tpot_p99_s"], slo["tpot_p99_s"]),
                "-" if last is None else f"{last['at'][11:19]} {last['reason']}",
            ]
        )
    note = "load: concurrent requests / one replica's capacity; ! marks a p99 over the SLO\n"
    return table(headers, body) + note


def _event_json(e: StoredEvent) -> dict[str, Any]:
    return {
        "position": e.position,
        "type": e.type,
        "model": e.model,
        "at": e.recorded_at.isoformat(),
        **{k: e.body.get(k) for k in ("current", "wanted", "action", "code", "reason")},
        "needed": e.body.get("needed"),
        "capacity": e.body.get("capacity"),
        "breaches": e.body.get("breaches", []),
        "inputs": e.body.get("inputs"),
    }


def cmd_history(app: App, args: argparse.Namespace) -> int:
    model = None if args.model is None else _model(app, args.model)
    kinds = (DECISION, HOLD) if args.holds else (DECISION,)
    events = AutoscaleStore(app.engine).events(
        model=model,
        kinds=kinds,
        after=None if args.since is None else parse_when(args.since),
        upto=None if args.until is None else parse_when(args.until),
        limit=max(args.limit, 1),
    )
    if args.json:
        print_json([_event_json(e) for e in events])
        return 0
    if not events:
        print("no autoscaling decisions recorded" + (f" for {shown(model)}" if model else ""))
        return 0
    rows = [
        [
            e.recorded_at.isoformat(timespec="seconds"),
            e.model,
            f"{e.body.get('current')} -> {e.body.get('wanted')}",
            str(e.body.get("code")),
            str(e.body.get("reason")),
        ]
        for e in events
    ]
    print(table(["at", "model", "replicas", "code", "reason"], rows), end="")
    return 0


def cmd_explain(app: App, args: argparse.Namespace) -> int:
    model = _model(app, args.model)
    store = AutoscaleStore(app.engine)
    policy = app.settings.autoscale
    catalog = app.service.catalog()
    found = catalog.resolve(model)
    assert found is not None
    now = datetime.now(UTC)
    own = policy.for_model(model)
    state = store.state().get(model)
    last = store.events(model=model, kinds=(DECISION,), limit=1)
    limits = model_limits([found], store.capacities())[model]
    windows = Rolling.of(store.windows(now - policy.window, now, model))
    heard = bool(store.heard(now - policy.window, now))
    summary = judged_summary(model, windows, heard, limits, own)
    replicas = SchedulerStore(app.engine).replicas(model=model)
    ready = sum(s.counts_as_ready for _, s in replicas)
    current = limits.min if state is None else state.wanted
    changed = None if state is None else state.changed_at
    nxt = decide(model, summary, current, limits, own, last=Last(changed), now=now)
    wanted = min(max(current, limits.min), max(limits.max, limits.min))
    if not own.enabled:
        why = "autoscaling is off for it ([autoscale] enabled, or its [autoscale.models] table)"
        wanted = limits.min
    elif state is None:
        why = "no decision recorded: it has scaling.min"
    else:
        e = last[0] if last else None
        why = (
            "its last decision"
            if e is None
            else f"decided at {e.recorded_at.isoformat(timespec='seconds')}: {e.body.get('reason')}"
        )
    data = {
        "model": model,
        "wanted": wanted,
        "placed": len(replicas),
        "ready": ready,
        "min": limits.min,
        "max": limits.max,
        "autoscaled": own.enabled,
        "why": why,
        "last_decision": None if not last else _event_json(last[0]),
        "limits": limits.to_json(),
        "policy": own.to_json(),
        "signals": None if summary is None else summary.to_json(),
        "next": {"wanted": nxt.wanted, "code": nxt.code, "reason": nxt.reason},
    }
    if args.json:
        print_json(data)
        return 0
    print(
        f"{shown(model)}: {wanted} wanted ({len(replicas)} placed, {ready} ready), "
        f"scaling {limits.min}..{limits.max}, autoscaling {'on' if own.enabled else 'off'}"
    )
    print(f"  why: {shown(why)}")
    cap = (
        f"{limits.capacity:g} (bench)" if limits.capacity else f"{own.default_capacity:g} (default)"
    )
    print(f"  capacity per replica: {cap}; target {own.target:g} of it")
    if summary is not None:
        # Rounded for reading (JSON keeps every digit): 0.0746024809999426 read as 0.075s.
        print(
            f"  last {policy.to_json()['window']}: {summary.requests} requests, load "
            f"{summary.load:.2f}, ttft p99 {_seconds(summary.ttft_p99_s)}, tpot p99 "
            f"{_seconds(summary.tpot_p99_s)} (SLO {_seconds(limits.ttft_p99_s)} / "
            f"{_seconds(limits.tpot_p99_s)})"
        )
        print(
            f"  queue wait p99 {_seconds(summary.queue_wait_p99_s)} (scales up above "
            f"{_seconds(queue_limit(limits, own))} in two consecutive windows of a gateway)"
        )
    if own.enabled:
        print(f"  if decided now: {nxt.wanted} ({nxt.code}): {shown(nxt.reason)}")
    return 0


def _seconds(value: float | None) -> str:
    """Seconds for a human: 3 significant digits (0.0746s, 12.3s), whole seconds from
    100 (1234s, not 1.23e+03s), "-" for none."""
    if value is None:
        return "-"
    return f"{value:.3g}s" if abs(value) < 100 else f"{value:.0f}s"


def _policy_file(path: Any) -> Policy:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_POLICY_BYTES + 1)
    except OSError as exc:
        raise Refused(f"{path}: cannot read the policy file: {exc.strerror}") from None
    if len(raw) > MAX_POLICY_BYTES:
        raise Refused(f"{path}: larger than {MAX_POLICY_BYTES} bytes; not a policy file")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise Refused(f"{path}: not valid TOML: {exc}") from None
    table_ = data.get("autoscale", data)
    try:
        return parse_policy(table_, f"{path}: [autoscale]")
    except PolicyError as exc:
        raise Refused(str(exc)) from None


def run_backtest(
    store: AutoscaleStore, since: datetime, until: datetime, policy: Policy | None, name: str
) -> Result:
    ticks = store.ticks(since, until)
    reach = max(
        [t.policy.window for t in ticks] + ([policy.window] if policy else []),
        default=timedelta(0),
    )
    reach_back = since - reach
    return backtest(
        ticks,
        store.windows(reach_back, until),
        heard=store.heard(reach_back, until),
        recorded=store.recorded(since, until),
        start=store.state(since),
        since=since,
        until=until,
        policy=policy,
        policy_name=name,
    )


def cmd_backtest(app: App, args: argparse.Namespace) -> int:
    since = parse_when(args.since)
    until = datetime.now(UTC) if args.until is None else parse_when(args.until)
    if until <= since:
        raise Refused(f"--until ({until.isoformat()}) must be after --since ({since.isoformat()})")
    policy = None if args.policy is None else _policy_file(args.policy)
    name = "recorded" if policy is None else f"{args.policy} ({policy.digest()[:12]})"
    store = AutoscaleStore(app.engine)
    result = run_backtest(store, since, until, policy, name)
    data = {
        "since": since.isoformat(),
        "until": until.isoformat(),
        "policy": name,
        "same_decisions": result.same,
        "totals": result.totals(),
        "models": {
            m: {"recorded": h.to_json(), "replayed": r.to_json(), "fixed": m in result.fixed}
            for m, (h, r) in result.models.items()
        },
    }
    if args.json:
        print_json(data)
        return 0
    print(
        f"backtest {since.isoformat(timespec='seconds')} .. {until.isoformat(timespec='seconds')}"
        f" under {shown(name)}"
    )
    rows = []
    for m, (was, would) in result.models.items():
        rows.append(
            [
                m,
                f"{len(was.decisions)} / {len(would.decisions)}",
                f"{was.replica_seconds / 3600:.3f} / {would.replica_seconds / 3600:.3f}",
                f"{was.breached} / {would.breached}",
                str(was.ticks),
            ]
        )
    print(
        table(["model", "decisions", "replica-hours", "breached windows", "windows"], rows),
        end="",
    )
    print("  (recorded / replayed)")
    totals = result.totals()
    h, r = totals["recorded"], totals["replayed"]
    fixed = [m for m in result.models if m in result.fixed]
    if fixed and len(fixed) == len(result.models):
        print(
            "nothing to compare: every model here has scaling.min == scaling.max in every "
            "round, so any policy is a no-op (its count never moves); widen a model's "
            "scaling.min..max to backtest a policy on it"
        )
    elif result.same:
        print("same decisions as recorded")
    else:
        print(
            f"different decisions: replica-hours {h['replica_hours']:.3f} -> "
            f"{r['replica_hours']:.3f} ({r['replica_hours'] - h['replica_hours']:+.3f}), "
            f"breached windows {h['breached_windows']:.0f} -> {r['breached_windows']:.0f} "
            f"({r['breached_windows'] - h['breached_windows']:+.0f})"
        )
    if fixed and len(fixed) < len(result.models):
        held = ", ".join(f"{shown(m)} ({result.fixed[m]})" for m in fixed)
        print(
            f"  held by scaling.min == scaling.max (no policy moves them; compared as "
            f"nothing): {held}"
        )
    for m, (h_side, r_side) in result.models.items():
        if [d[:3] for d in h_side.decisions] == [d[:3] for d in r_side.decisions]:
            continue
        print(f"  {shown(m)}:")
        for label, side in (("recorded", h_side), ("replayed", r_side)):
            steps = ", ".join(
                f"{at.isoformat(timespec='seconds')[11:]} {c}->{w}"
                for at, c, w, _ in side.decisions
            )
            print(f"    {label}: {steps or 'no change'}")
    return 0
