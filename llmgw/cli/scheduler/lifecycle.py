"""The replica lifecycle's commands: nodes cordon/uncordon/drain, rollout status."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from catalog.forms.text import shown as shown_text
from llmgw.cli.shared.context import App, Refused, print_json
from llmgw.views import iso, replica_state_json, service_change_json
from scheduler.daemon.round_runner import Placer
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.persistence.store import SchedulerStore
from scheduler.planner.fleet.placements import Placement

if TYPE_CHECKING:
    from catalog import Catalog
    from events.catalog_service import CatalogService


def cmd_service(app: App, args: argparse.Namespace) -> int:
    from llmgw.cli.catalog.commands import login_user
    from scheduler.daemon.node_service import NodeServiceError, change_service

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


def service_in_force(app: App) -> tuple[CatalogService, str]:
    """The catalog the control plane runs, and a note when that is not the file as it is.

    ``llmgw serve`` and the daemon record the declared catalog they run
    (``declared.status``). When this command's own reading of the file differs (an
    edit they refused, or one they have not taken yet) the rollout is the one their
    catalog makes, not one this command would imagine from the file.
    """
    from catalog import CatalogError
    from catalog.changes.digest import catalog_digest
    from declared.status import read_status
    from events.catalog_service import CatalogService

    path = app.settings.config_path
    rows = read_status(app.engine, str(path.resolve())) if path is not None else []
    own: Catalog | None = None
    own_error = ""
    try:
        own = app.declared
    except CatalogError as exc:
        own_error = str(exc)
    if rows and (own is None or catalog_digest(own) != rows[0].digest):
        row = rows[0]
        why = (
            f"refused ({row.refusal.text()})"
            if row.refusal is not None
            else "not taken yet by the running control plane (it looks every second)"
        )
        note = (
            f"the declared file {row.path} as it is now is {why}; shown: the catalog in "
            f"force (digest {row.digest[:12]}, since {iso(row.loaded_at)})"
        )
        service = CatalogService(
            app.store, row.catalog(), app.config_label, snapshot_key=app.snapshot_key
        )
        return service, note
    if own is None:
        raise Refused(own_error)
    return app.service, ""


def cmd_rollout_status(app: App, args: argparse.Namespace) -> int:
    service, note = service_in_force(app)
    catalog = service.catalog()
    model = catalog.canonical(args.model)
    if model is None:
        raise Refused(
            f"model {args.model!r} is not in the catalog (neither a name nor an alias); "
            "`llmgw models` lists them"
        )
    store = SchedulerStore(app.engine)
    statuses = store.state().lifecycle.statuses
    # What a round would do now, writing nothing: the rollout as it stands.
    plan = Placer(service, store).run(dry_run=True, now=datetime.now(UTC)).plan
    progress = next((r for r in plan.rollouts if r.model == model), None)
    running = [p for p in plan.keep if p.model == model]

    def row(p: Placement) -> dict[str, object]:
        status = statuses.get((p.model, p.replica))
        shown = replica_state_json(status) if status else {"state": "not placed yet"}
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
    out["declared_note"] = note or None
    if args.json:
        print_json(out)
        return 0
    if note:
        print(f"note: {shown_text(note)}")
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
        # In the plan a round would make now, not placed yet: the next round places it.
        return "not placed yet (the next placement round places it)"
    return f"{status.shown_state} since {iso(status.since)}"
