"""Scheduler commands: nodes report/list/forget, place, placements, daemon."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from catalog.forms.text import shown
from catalog.reading.documents import read_file
from llmgw.cli.shared import live
from llmgw.cli.shared.context import App, Refused, print_json
from llmgw.cli.shared.tables import table
from llmgw.policy_view import judge, judging_policy
from llmgw.views import (
    iso,
    move_json,
    node_json,
    placed_replica_json,
    placement_json,
    replica_context_json,
    rollout_json,
    unplaced_json,
)
from scheduler.daemon.leader import leadership_for
from scheduler.daemon.loop import Daemon
from scheduler.daemon.round_runner import Placer
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.serving_policy import STARTED, ServingProcess
from scheduler.persistence.store import SchedulerStore
from scheduler.planner.fleet.inventory import Node, NodeReport, NodeReportError, parse_node_report
from scheduler.planner.fleet.placements import Demand, Placement, Plan
from scheduler.planner.resilience import resilience


def load_reports(path: Path) -> list[NodeReport]:
    data = read_file(path, "node report")
    if isinstance(data, dict) and "nodes" in data and "name" not in data:
        extra = sorted(set(data) - {"nodes"})
        if extra:
            raise Refused(f"{path}: unknown top-level key(s) {', '.join(map(repr, extra))}")
        data = data["nodes"]
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(i, dict) for i in items):
        raise Refused(f"{path}: expected a node mapping, a list of them, or `nodes: [...]`")
    reports: list[NodeReport] = []
    problems: list[str] = []
    for item in items:
        try:
            reports.append(parse_node_report(item))
        except NodeReportError as exc:
            problems.extend(exc.problems)
    names = [r.name for r in reports]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    problems.extend(f'node "{n}" is reported twice in {path}' for n in duplicates)
    if problems:
        # All or nothing: a half-recorded inventory is harder to reason about than none.
        raise Refused(f"{path}: nothing recorded:\n  " + "\n  ".join(problems))
    return reports


def cmd_nodes_report(app: App, args: argparse.Namespace) -> int:
    reports = load_reports(args.file)
    nodes = SchedulerStore(app.engine).report(
        reports, datetime.now(UTC), endpoints=app.settings.server.endpoints
    )
    if args.json:
        print_json({"recorded": [n.name for n in nodes]})
        return 0
    print(f"recorded {len(nodes)} node report(s): {', '.join(shown(n.name) for n in nodes)}")
    return 0


def cmd_nodes_list(app: App, args: argparse.Namespace) -> int:
    store = SchedulerStore(app.engine)

    def view() -> tuple[Any, str]:
        # Read each refresh: a server restarted with another policy is followed.
        judged = judge(app.settings, store.policy_in_force())
        now = datetime.now(UTC)
        cordons, hosted = store.service()
        rows: list[dict[str, Any]] = [
            {
                **node_json(n, now, judged.policy, cordons.get(n.name), hosted.get(n.name, 0)),
                "judged_by": judged.json,
            }
            for n in store.nodes()
        ]
        return rows, _nodes_table(rows) + judged.text + "\n"

    return live.show(view, watch=args.watch, as_json=args.json, title="llmgw nodes list")


def _nodes_table(rows: list[dict[str, Any]]) -> str:
    headers = ["name", "gpu_class", "gpus", "reserved", "memory_gb", "fabric", "state", "service"]
    headers.append("labels")
    return table(
        headers,
        [
            [
                r["name"],
                r["gpu_class"] or "-",
                str(r["gpus"]),
                str(r["gpus_reserved"]),
                "?" if r["memory_gb"] is None else f"{r['memory_gb']:g}",
                r["fabric"] or "-",
                r["state"],
                r["service"],
                ",".join(f"{k}={v}" for k, v in r["labels"].items()),
            ]
            for r in rows
        ],
    )


def cmd_nodes_forget(app: App, args: argparse.Namespace) -> int:
    if not SchedulerStore(app.engine).forget(args.name):
        raise Refused(f"node {args.name!r} is not in the inventory")
    if args.json:
        print_json({"forgot": args.name})
        return 0
    print(f"forgot node {shown(args.name)}; its replicas are placed elsewhere next round")
    return 0


def _placer(app: App, policy: StalenessPolicy) -> Placer:
    from llmgw import autoscaling

    wanted = autoscaling.wanted(app.engine, app.settings.autoscale)
    return Placer(app.service, SchedulerStore(app.scheduler_engine), policy, wanted)


def cmd_place(app: App, args: argparse.Namespace) -> int:
    # A round by the policy the server runs (and its dry run, what that round would do),
    # not by this command's defaults; this command's flags still win.
    judged = judging_policy(app.settings, app.engine)
    leadership = None
    if not args.dry_run:
        leadership = leadership_for(
            app.settings.database_url, app.settings.lease_s, engine=app.scheduler_engine
        )
        if not leadership.ensure():
            raise Refused(
                "a placement daemon is running against this database and places every round; "
                "use `llmgw place --dry-run` to see what it would do"
            )
    try:
        outcome = _placer(app, judged.policy).run(
            dry_run=args.dry_run, fence=None if leadership is None else leadership.fence()
        )
    finally:
        if leadership is not None:
            leadership.release()
    plan = outcome.plan
    if outcome.outcome_unrecorded is not None:
        print(
            f"warning: round {outcome.round_id} is written, but why its unplaced replicas "
            f"are unplaced was not recorded ({shown(outcome.outcome_unrecorded)}); the next "
            "round records it",
            file=sys.stderr,
        )
    if args.json:
        print_json(
            {
                "catalog_position": outcome.catalog_position,
                "placements": [placement_json(p) for p in plan.placements],
                "unplaced": [unplaced_json(u) for u in plan.unplaced],
                "placed": [placement_json(p) for p in plan.place],
                "removed": [
                    {**placement_json(r.placement), "reason": r.reason} for r in plan.remove
                ],
                "mass_loss": plan.mass_loss,
                "round": outcome.round_id,
                "strategy": plan.strategy,
                "resilience": {r.model: r.to_json() for r in plan.resilience},
                "failed": [
                    {**placement_json(f.placement), "reason": f.reason} for f in plan.failures
                ],
                "rollouts": [rollout_json(r) for r in plan.rollouts],
                "notes": [{"model": m, "note": n} for m, n in plan.notes],
                # Moves started by this round (defragmentation, spread repair), and the
                # replicas still being moved (each one stops once its copy is ready).
                "moves": [move_json(m) for m in plan.moves],
                "moving": [placement_json(p) for p in plan.moving],
                "judged_by": judged.json,
            }
        )
        return 0
    verb = "would place" if args.dry_run else "placed"
    print(
        f"catalog position {outcome.catalog_position}, {len(outcome.nodes)} nodes: "
        f"{verb} {len(plan.place)}, "
        f"{'would remove' if args.dry_run else 'removed'} {len(plan.remove)}, "
        f"kept {len(plan.keep)}, unplaced {len(plan.unplaced)}"
    )
    print(f"  {judged.text}")
    for p in plan.place:
        print(f"  + {_replica(p)}")
    for r in plan.remove:
        print(f"  - {_replica(r.placement)}: {shown(r.reason)}")
    for u in plan.unplaced:
        print(f"  ! {shown(u.model)}[{u.replica}] unplaced: {shown(u.reason)}")
    for model, note in plan.notes:
        print(f"  ~ {shown(model)}: {shown(note)}")
    for m in plan.moves:
        copy = "" if m.copy is None else f" as replica {m.copy.replica}"
        print(
            f"  > {_replica(m.placement)} moves to {shown(m.to)}{copy}, surge-first: "
            f"{shown(m.reason)}"
        )
    for rollout in plan.rollouts:
        waiting = rollout.waiting or "every old replica is replaced"
        print(
            f"  > {shown(rollout.model)} rollout ({shown(rollout.cause)}): {len(rollout.old)} "
            f"old, {len(rollout.new)} new; {shown(waiting)}"
        )
    if plan.mass_loss:
        print(
            f"  mass loss: {len(plan.lost_nodes)} nodes look lost at once; their replicas are kept"
        )
    if plan.strategy != "policy":
        print(
            f"  placed by {plan.strategy}: it placed more GPUs than the planner's own order "
            "on the same free capacity; its replicas were then spread by same-shape swaps "
            "and moves into free room (the ~ lines), which keep the GPU count"
        )
    print_resilience_changes(outcome.before, plan, outcome.nodes)
    return 0


def _replica(p: Placement) -> str:
    return f"{shown(p.model)}[{p.replica}] {shown(p.profile)} on {', '.join(map(shown, p.nodes))}"


def print_resilience_changes(
    before: Sequence[Placement], plan: Plan, nodes: Sequence[Node]
) -> None:
    """Each model whose resilience the plan changes, before -> after (what a reviewer checks)."""
    demands = [Demand(r.model, 0, (), spread_by=r.label) for r in plan.resilience]
    was = {r.model: r for r in resilience(demands, before, {n.name: n for n in nodes})}
    for now in plan.resilience:
        old = was.get(now.model)
        if old is None or (old.nodes, old.domains, old.replicas) != (
            now.nodes,
            now.domains,
            now.replicas,
        ):
            then = "?" if old is None else old.describe()
            print(f"  resilience {shown(now.model)}: {then} -> {now.describe()}")


def cmd_placements(app: App, args: argparse.Namespace) -> int:
    store = SchedulerStore(app.engine)

    def view() -> tuple[Any, str]:
        from llmgw.cli.scheduler.lifecycle import service_in_force

        # The catalog the control plane runs: after an edit of the declared file it
        # refused, that is the catalog in force, not this command's reading of the file.
        catalog = service_in_force(app)[0].catalog()
        model = args.model
        if model is not None:  # resolved each refresh: an alias can move to another model
            model = catalog.canonical(model) or model
        replicas = store.replicas(node=args.node, model=model)
        shown_rows = [
            {**placed_replica_json(p, s), **replica_context_json(p, catalog, s)}
            for p, s in replicas
        ]
        warnings = [
            f"warning: {shown(r['model'])}[{r['replica']}]: {shown(r['context_warning'])}"
            for r in shown_rows
            if r["context_warning"]
        ]
        text = _placements_table(replicas) + "".join(w + "\n" for w in warnings)
        return shown_rows, text

    return live.show(view, watch=args.watch, as_json=args.json, title="llmgw placements")


def _placements_table(replicas: Sequence[tuple[Placement, ReplicaStatus]]) -> str:
    headers = ["model", "replica", "profile", "gpu_class", "gpus/node", "nodes", "state", "since"]
    headers.append("endpoint")
    return table(
        headers,
        [
            [
                p.model,
                str(p.replica),
                p.profile,
                p.gpu_class or "cpu",
                str(p.gpus_per_node),
                ",".join(p.nodes),
                s.shown_state,
                iso(s.since),
                s.endpoint or "-",
            ]
            for p, s in replicas
        ],
    )


def cmd_daemon(app: App, args: argparse.Namespace) -> int:
    from llmgw import autoscaling

    scaler = autoscaling.autoscaler(app.scheduler_engine, app.service, app.settings.autoscale)
    placer = _placer(app, app.settings.policy)
    if not args.once:
        # What the CLI's views judge by from now on (scheduler.persistence.serving_policy);
        # a one-off round records its policy with the round, if it changes anything.
        placer.serving = ServingProcess("daemon", places=True, interval_s=app.settings.interval_s)
        placer.store.record_policy(
            placer.serving, placer.policy, why=STARTED, now=datetime.now(UTC)
        )
    daemon = Daemon(
        placer,
        leadership_for(
            app.settings.database_url, app.settings.lease_s, engine=app.scheduler_engine
        ),
        app.settings.interval_s,
        autoscaling.hook(scaler),
    )
    if args.once:
        try:
            daemon.round()
        finally:
            daemon.leadership.release()
        return 0
    from llmgw.declared_watch import watch_declared

    watcher = watch_declared(
        app.settings.config_path,
        app.declared,
        [app.service],
        app.service,
        engine=app.engine,
        role="daemon",
    )
    try:
        daemon.run_forever()
    finally:
        if watcher is not None:
            watcher.stop()
    return 0
