"""``llmgw serve`` (the HTTP API) and ``llmgw token new`` (its bearer tokens).

The web framework is imported only when ``serve`` runs, so the other commands
start as fast as before.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import structlog

from llmgw.api.guards.tokens import TokenConfigError, issue_token, parse_env_tokens
from llmgw.api.runtime.settings import ApiSettings
from llmgw.cli.operate import token_file
from llmgw.cli.shared.context import EXIT_REFUSED, App, Refused, print_json
from llmgw.cli.shared.tables import table
from llmgw.settings import SettingsError

log = structlog.get_logger("llmgw.api")


def _auth_path(app: App) -> Path:
    path = app.settings.auth_file
    if path is None:
        raise Refused(
            "no auth file is configured: give --auth-file, LLMGW_AUTH_FILE, or [auth] file "
            "in llmgw.toml"
        )
    return path


def cmd_token_list(app: App, args: argparse.Namespace) -> int:
    path = _auth_path(app)
    try:
        tokens = token_file.entries(path)
    except SettingsError as exc:
        raise Refused(str(exc)) from None
    rows = [
        {
            "name": e.name,
            "role": e.role.value,
            "nodes": list(e.nodes),
            "models": list(e.models),
            "sha256": e.sha256[:12],
            "source": str(path),
        }
        for e in tokens
    ]
    from_env = os.environ.get("LLMGW_TOKENS")
    if from_env:
        try:
            extra = parse_env_tokens(from_env)
        except TokenConfigError as exc:
            raise Refused(str(exc)) from None
        rows += [
            {
                "name": e.name,
                "role": e.role.value,
                "nodes": list(e.nodes),
                "models": list(e.models),
                "sha256": e.sha256[:12],
                "source": "LLMGW_TOKENS",
            }
            for e in extra
        ]
    if args.json:
        print_json(rows)
        return 0
    headers = ["name", "role", "nodes", "models", "sha256", "source"]
    sys.stdout.write(
        table(
            headers,
            [
                [
                    str(r[h]) if h not in ("nodes", "models") else ",".join(r[h]) or "-"
                    for h in headers
                ]
                for r in rows
            ],
        )
    )
    return 0


def cmd_token_revoke(app: App, args: argparse.Namespace) -> int:
    path = _auth_path(app)
    try:
        dropped = token_file.revoke(path, args.name)
    except SettingsError as exc:
        raise Refused(str(exc)) from None
    if not dropped:
        raise Refused(
            f"{path}: no token named {args.name!r} (see `llmgw token list`); a token given "
            "in LLMGW_TOKENS is revoked by removing it there"
        )
    if args.json:
        print_json({"revoked": args.name, "auth_file": str(path)})
        return 0
    print(f"revoked {args.name} in {path}; it is refused once `llmgw serve` restarts")
    return 0


def cmd_token_new(app: App, args: argparse.Namespace) -> int:
    try:
        models = [m.strip() for m in args.models.split(",") if m.strip()]
        issued = issue_token(args.name, args.role, args.node, models)
    except TokenConfigError as exc:
        raise Refused(str(exc)) from None
    entry = issued.entry
    if args.json and args.append_to is not None:
        try:
            token_file.append(args.append_to, entry)
        except SettingsError as exc:
            raise Refused(str(exc)) from None
    if args.json:
        print_json(
            {
                "name": entry.name,
                "role": entry.role.value,
                "nodes": list(entry.nodes),
                "models": list(entry.models),
                "token": issued.token,
                "sha256": entry.sha256,
                "toml": entry.to_toml(),
                "env": entry.to_env(),
            }
        )
        return 0
    if args.append_to is not None:
        try:
            token_file.append(args.append_to, entry)
        except SettingsError as exc:
            raise Refused(str(exc)) from None
    print(issued.token)
    if args.append_to is not None:
        print(
            f"# The token above is shown once: give it to {entry.name} now. Its SHA-256 "
            f"was appended to {args.append_to} (applies when `llmgw serve` next starts)."
        )
        return 0
    print(
        f"# The token above is shown once: give it to {entry.name} now. Only its SHA-256 "
        "is configured.\n# Add this to the auth file (--auth-file / LLMGW_AUTH_FILE):"
    )
    print(entry.to_toml())
    print(f"# or add this entry to LLMGW_TOKENS (entries separated by ';'): {entry.to_env()}")
    return 0


def cmd_serve(app: App, args: argparse.Namespace) -> int:
    conf = app.settings
    policy = conf.policy
    try:
        settings = ApiSettings.load(
            conf.auth_file,
            reads_open=conf.reads_open,
            stream_poll_s=conf.server.stream_poll_s,
            catalog_max_age_s=conf.server.catalog_max_age_s,
            policy=policy,
            endpoints=conf.server.endpoints,
            autoscale=conf.autoscale,
        )
    except (SettingsError, ValueError) as exc:
        raise Refused(str(exc)) from None

    from events.catalog_service import CatalogService
    from llmgw.api import server
    from llmgw.api.app import create_app
    from llmgw.api.runtime.scheduler_thread import SchedulerThread
    from llmgw.api.runtime.services import Services
    from scheduler.daemon.leader import LeaseLeadership, leadership_for
    from scheduler.persistence.store import SchedulerStore

    engine = app.engine  # migrates an empty database, as every command does
    services = Services.build(
        engine, app.declared, app.config_label, settings, snapshot_key=app.snapshot_key
    )
    if not len(services.book):
        log.warning(
            "api.no_tokens",
            detail="no token is configured: every write is refused (401); see `llmgw token new`",
        )
    scheduler = None
    leadership = None
    if conf.server.with_scheduler:
        # The scheduler's connections are its own, with the leader's keepalives and
        # timeouts (scheduler.daemon.leader), not the API's pool.
        scheduler_engine = app.scheduler_engine
        leadership = leadership_for(conf.database_url, conf.lease_s, engine=scheduler_engine)
        scheduler = SchedulerThread.build(
            catalog=CatalogService(
                app.store, app.declared, app.config_label, snapshot_key=app.snapshot_key
            ),
            store=SchedulerStore(scheduler_engine),
            policy=policy,
            leadership=leadership,
            interval=conf.interval_s,
            metrics=services.metrics,
            engine=scheduler_engine,
            autoscale=conf.autoscale,
        )
    # The declared file is watched (and SIGHUP looks now): an edit is taken whole or
    # refused whole, by the API's catalog and the scheduler's alike (declared.reload).
    from llmgw.declared_watch import watch_declared

    reloaded = [services.gate.service]
    if scheduler is not None:
        reloaded.append(scheduler.daemon.placer.catalog)
    watcher = watch_declared(
        conf.config_path,
        app.declared,
        reloaded,
        services.gate.service,
        engine=engine,
        role="serve",
        on_outcome=services.metrics.observe_declared,
    )
    if watcher is not None:
        services.declared_watch.reloader = watcher.reloader
    host, port = conf.server.host, conf.server.port
    try:
        sock = server.listen(host, port)
    except OSError as exc:
        raise Refused(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    where = server.url_of(sock)
    if isinstance(leadership, LeaseLeadership):
        # `llmgw status` names the leader by the URL it serves on.
        leadership.holder = f"{where} {leadership.holder}"
    log.info("api.listening", url=where, reads_open=settings.reads_open, tokens=len(services.book))
    # uvicorn raises the signal that stopped it again once it has shut down; this handler
    # takes it, so a stop by SIGTERM or Ctrl-C exits 0, like `llmgw daemon`. A signal
    # that comes before uvicorn's own handlers are in place (after the listening line
    # below and before its start) is remembered, and the server stops as soon as it has started.
    stopping = services.stopping
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stopping.set())
    print(f"llmgw serve: listening on {where}", flush=True)
    if not server.run(
        create_app(services, scheduler=scheduler), sock, services.stopping, conf.server.limits
    ):
        print("error: the API did not start (see the log above)", file=sys.stderr)
        return EXIT_REFUSED
    if watcher is not None:
        watcher.stop()
    log.info("api.stopped")
    return 0
