"""Catalog commands: models, add, apply, remove, resolve, show, db.

The audit and debugging commands (history, replay, diff, verify, snapshot) are
in ``audit``.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from catalog import load_definitions
from catalog.forms.text import shown
from catalog.secrecy.secrets import redact
from events.database.migrate import current_revision, head_revision, upgrade
from events.read.time_travel import catalog_at
from events.write.commands import CommandResult
from llmgw.cli.catalog import dry_run
from llmgw.cli.shared.context import App, Refused, print_json, resolve_position
from llmgw.cli.shared.tables import catalog_table, table
from llmgw.views import catalog_json, command_json, model_entry
from scheduler.daemon.node_service import replica_counts
from scheduler.persistence.store import SchedulerStore
from scheduler.planner.demands import demands
from scheduler.planner.resilience import resilience


def login_user() -> str:
    """The actor when --actor is not given: who is logged in, so the log never says ''."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        return ""


def _shown(args: argparse.Namespace, value: Any) -> Any:
    # Output is pasted into tickets and chats: secret-looking values stored in plain text
    # before they were refused read [redacted] unless asked for (catalog.secrecy.secrets).
    return value if args.show_secrets else redact(value)


def cmd_models(app: App, args: argparse.Namespace) -> int:
    catalog = app.service.catalog()
    store = SchedulerStore(app.engine)
    counts = replica_counts(catalog, store.replicas())
    nodes = store.nodes()
    current = resilience(demands(catalog), store.state().placements, {n.name: n for n in nodes})
    if args.json:
        figures = {r.model: r for r in current}
        print_json(
            _shown(
                args,
                [
                    model_entry(catalog, m, counts[m.name], figures.get(m.name))
                    for m in catalog.models()
                ],
            )
        )
        return 0
    text = catalog_table(catalog)
    sys.stdout.write(text or "no models\n")
    if counts:
        sys.stdout.write("\n")
        sys.stdout.write(
            table(
                ["model", "wanted", "placed", "ready"],
                [[name, str(c.wanted), str(c.placed), str(c.ready)] for name, c in counts.items()],
            )
        )
    if text:
        print("resilience (the placements now; lost with: the fewest failures that stop it):")
        for r in current:
            print(f"  {shown(r.model):<30} {r.describe()}")
    return 0


def cmd_add(app: App, args: argparse.Namespace) -> int:
    models = load_definitions(args.file)
    if args.dry_run:
        return dry_run.show_add(app, models, as_json=args.json)
    actor = login_user() if args.actor is None else args.actor
    result = app.service.add(models, actor=actor, reason=args.reason, key=args.key)
    return _print_result(result, "already recorded" if result.already_recorded else "added", args)


def cmd_apply(app: App, args: argparse.Namespace) -> int:
    models = load_definitions(args.file)
    if len(models) != 1:
        raise Refused(
            f"{args.file}: apply takes one model definition, and this file holds "
            f"{len(models)}; apply them one at a time (or add a list with llmgw add)"
        )
    if args.dry_run:
        return dry_run.show_apply(app, models[0], as_json=args.json)
    actor = login_user() if args.actor is None else args.actor
    result = app.service.apply(models[0], actor=actor, reason=args.reason, key=args.key)
    if args.json:
        print_json(result.to_json())
    else:
        sys.stdout.write(result.render())
    return 0


def cmd_remove(app: App, args: argparse.Namespace) -> int:
    actor = login_user() if args.actor is None else args.actor
    result = app.service.remove(args.name, actor=actor, reason=args.reason, key=args.key)
    verb = "already recorded: removed" if result.already_recorded else "removed"
    return _print_result(result, verb, args)


def _print_result(result: CommandResult, verb: str, args: argparse.Namespace) -> int:
    if args.json:
        print_json(command_json(result))
        return 0
    for event in result.events:
        print(f"{verb} {shown(event.model)} at position {event.position}")
    return 0


def cmd_resolve(app: App, args: argparse.Namespace) -> int:
    canonical = app.service.catalog().canonical(args.name)
    if canonical is None:
        raise Refused(
            f"model {args.name!r} is not in the catalog (neither a name nor an alias); "
            "`llmgw models` lists them"
        )
    if args.json:
        print_json({"name": args.name, "canonical": canonical})
    else:
        print(shown(canonical))
    return 0


def cmd_show(app: App, args: argparse.Namespace) -> int:
    until = resolve_position(app, args.at)
    position, catalog = catalog_at(
        app.store,
        app.declared,
        until,
        config_path=app.config_label,
        snapshots=app.service.snapshots,
    )
    if args.json:
        print_json(_shown(args, catalog_json(catalog)))
    else:
        print(f"catalog at position {position}:")
        sys.stdout.write(catalog_table(catalog) or "no models\n")
    return 0


def cmd_db_upgrade(app: App, args: argparse.Namespace) -> int:
    engine = app.engine  # migrates on first use
    upgrade(engine)
    if args.json:
        print_json({"revision": current_revision(engine), "head": head_revision()})
    else:
        print(f"schema at {current_revision(engine)}")
    return 0


def cmd_db_current(app: App, args: argparse.Namespace) -> int:
    revision = current_revision(app.engine)
    if args.json:
        print_json({"revision": revision, "head": head_revision()})
    else:
        print(f"{revision} (head {head_revision()})")
    return 0
