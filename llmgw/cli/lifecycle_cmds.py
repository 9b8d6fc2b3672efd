"""The replica lifecycle's commands: nodes cordon/uncordon/drain, rollout status."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from llmgw.api.views import replica_state_json
from llmgw.cli.catalog_cmds import login_user
from llmgw.cli.context import App, Refused, iso, print_json
from scheduler.placements import Placement
from scheduler.replicas import ReplicaStatus
from scheduler.rounds import Placer
from scheduler.service import NodeServiceError, change_service
from scheduler.store import SchedulerStore


def register_nodes(
    nodes_sub: argparse._SubParsersAction[argparse.ArgumentParser],
    parent: argparse.ArgumentParser,
) -> None:
    helps = {
        "cordon": "take no new replicas on a node; what runs there stays",
        "uncordon": "put a cordoned or draining node back in service",
        "drain": "move a node's replicas elsewhere, surge-first, and take no new ones",
    }
    for action, text in helps.items():
        p = nodes_sub.add_parser(action, parents=[parent], help=text)
        p.add_argument("name", help="the node, as its agent reports it")
        p.add_argument("--reason", default="", help="why (recorded with the event)")
        p.add_argument(
            "--actor", default="", help="who (recorded with the event; default: the login user)"
        )
        p.add_argument("--json", action="store_true", help="as JSON, for programs")
        p.set_defaults(run=cmd_service, action=action)


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    p = sub.add_parser("rollout", parents=[parent], help="replacing a model's replicas")
    rsub = p.add_subparsers(dest="rollout_command", required=True)
    s = rsub.add_parser(
        "status", parents=[parent], help="old and new replicas, and what the rollout waits for"
    )
    s.add_argument("model", help="a model name or alias")
    s.add_argument("--json", action="store_true", help="as JSON, for programs")
    s.set_defaults(run=cmd_rollout_status)


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
        print_json(
            {
                "node": change.node,
                "action": change.action,
                "changed": change.changed,
                "before": None if change.before is None else change.before.mode,
                "replicas_left": change.replicas_left,
                "message": change.describe(),
            }
        )
        return 0
    print(change.describe())
    return 0


def cmd_rollout_status(app: App, args: argparse.Namespace) -> int:
    catalog = app.service.catalog()
    model = catalog.canonical(args.model)
    if model is None:
        raise Refused(f"model {args.model!r} is not in the catalog (neither a name nor an alias)")
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
