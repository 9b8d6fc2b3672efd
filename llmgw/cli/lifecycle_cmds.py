"""The replica lifecycle's commands: nodes cordon/uncordon/drain, rollout status."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from llmgw.cli.catalog_cmds import login_user
from llmgw.cli.context import App, Refused, print_json
from llmgw.views import iso, replica_state_json, service_change_json
from scheduler.daemon.node_service import NodeServiceError, change_service
from scheduler.daemon.round_runner import Placer
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.persistence.store import SchedulerStore
from scheduler.planner.placements import Placement


def cmd_service(app: App, args: argparse.Namespace) -> int:
    try:
        change = change_service(
            SchedulerStore(app.engine),
            args.name,
            args.action,
            actor=args.actor or login_user() or "cli",
            reason=args.reason,
        )
    except NodeServiceError as exc:
        raise Refused(str(exc)) from None
    if args.json:
        print_json(service_change_json(change))
        return 0
    print(change.describe())
    return 0


def cmd_rollout_status(app: App, args: argparse.Namespace) -> int:
    catalog = app.service.catalog()
    model = catalog.canonical(args.model)
    if model is None:
        raise Refused(
            f"model {args.model!r} is not in the catalog (neither a name nor an alias); "
            "`llmgw models` lists them"
        )
    store = SchedulerStore(app.engine)
    statuses = store.state().lifecycle.statuses
    # What a round would do now, writing nothing: the rollout as it stands.
    plan = Placer(app.service, store).run(dry_run=True, now=datetime.now(UTC)).plan
    progress = next((r for r in plan.rollouts if r.model == model), None)
    running = [p for p in plan.keep if p.model == model]

    def row(p: Placement) -> dict[str, object]:
        status = statuses.get((p.model, p.replica))
        shown = replica_state_json(status) if status else {"state": "to be placed"}
        return {"replica": p.replica, "nodes": list(p.nodes), "profile": p.profile, **shown}

    if progress is None:
        out = {
            "model": model,
            "in_progress": False,
            "cause": None,
            "old": [],
            "new": [row(p) for p in running],
            "waiting": "",
        }
    else:
        out = {
            "model": model,
            "in_progress": True,
            "cause": progress.cause,
            "old": [row(p) for p in progress.old],
            "new": [row(p) for p in progress.new],
            "waiting": progress.waiting,
        }
    if args.json:
        print_json(out)
        return 0
    if progress is None:
        print(f"{model}: no rollout in progress; {len(running)} replica(s) run what it defines")
        return 0
    print(f"{model}: rolling out ({progress.cause})")
    for title, group in (("old", progress.old), ("new", progress.new)):
        for p in group:
            status = statuses.get((p.model, p.replica))
            print(f"  {title} replica {p.replica} on {', '.join(p.nodes)}: {_state(status)}")
    print(f"  {progress.waiting or 'every old replica is replaced'}")
    return 0


def _state(status: ReplicaStatus | None) -> str:
    if status is None:
        return "to be placed this round"
    return f"{status.shown_state} since {iso(status.since)}"
