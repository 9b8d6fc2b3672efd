"""``llmgw serve`` (the HTTP API) and ``llmgw token new`` (its bearer tokens).

The web framework is imported only when ``serve`` runs, so the other commands
start as fast as before.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path
from types import FrameType

import structlog

from llmgw import logs
from llmgw.api.auth import Role, TokenConfigError, issue_token
from llmgw.api.settings import ApiSettings, SettingsError
from llmgw.cli.context import EXIT_REFUSED, App, Refused, print_json
from llmgw.cli.scheduler_cmds import preemption_default
from scheduler import DEFAULT_STALENESS, StalenessPolicy

log = structlog.get_logger("llmgw.api")


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "serve",
        parents=[parent],
        help="the control plane's HTTP API (agents report, operators change the catalog)",
        description="Serve the API over the same database as the other commands. Tokens come "
        "from --auth-file (env LLMGW_AUTH_FILE) and env LLMGW_TOKENS; see `llmgw token new`.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--auth-file", type=Path, metavar="PATH", help="TOML settings with tokens")
    p.add_argument(
        "--open-reads",
        action="store_true",
        default=None,
        help="let GET routes answer without a token (writes always need one; env "
        "LLMGW_OPEN_READS=1, or reads_open in the auth file)",
    )
    p.add_argument(
        "--with-scheduler",
        action="store_true",
        help="also run placement rounds in the background, as `llmgw daemon` would (the same "
        "leadership: one scheduler places per database)",
    )
    p.add_argument("--interval", type=float, default=10.0, metavar="SECONDS")
    p.add_argument(
        "--stale-after",
        type=float,
        default=float(
            os.environ.get("LLMGW_STALE_AFTER", DEFAULT_STALENESS.stale_after.total_seconds())
        ),
        metavar="SECONDS",
        help="a node silent this long gets nothing new (env LLMGW_STALE_AFTER)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=float(os.environ.get("LLMGW_GRACE", DEFAULT_STALENESS.grace.total_seconds())),
        metavar="SECONDS",
        help="further silence after which its replicas move (env LLMGW_GRACE)",
    )
    p.add_argument(
        "--no-preemption",
        dest="preemption",
        action="store_false",
        default=preemption_default(),
        help="never evict lower-priority replicas, cluster-wide (env LLMGW_PREEMPTION=0)",
    )
    p.add_argument(
        "--stream-poll",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="how often an idle event stream looks for new events (default 0.5)",
    )
    p.add_argument(
        "--catalog-max-age",
        type=float,
        default=0.1,
        metavar="SECONDS",
        help="a read may be answered from a catalog checked against the log this long ago; "
        "changes through this server are seen at once (default 0.1; 0: check every read)",
    )
    p.set_defaults(run=cmd_serve)

    t = sub.add_parser("token", parents=[parent], help="bearer tokens for `llmgw serve`")
    t_sub = t.add_subparsers(dest="token_command", required=True)
    n = t_sub.add_parser(
        "new",
        parents=[parent],
        help="issue a token: printed once, with the entry to configure (its hash)",
        description="Prints the token on the first line (shown once; store it now), then "
        "the [[tokens]] entry for the auth file, which holds only the token's SHA-256.",
    )
    n.add_argument("name", help="who holds it; recorded as the actor of its changes")
    n.add_argument("--role", required=True, choices=[r.value for r in Role])
    n.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NODE",
        help="a node an agent token may report (repeat for several; agents only)",
    )
    n.add_argument("--json", action="store_true")
    n.set_defaults(run=cmd_token_new)


def cmd_token_new(app: App, args: argparse.Namespace) -> int:
    try:
        issued = issue_token(args.name, args.role, args.node)
    except TokenConfigError as exc:
        raise Refused(str(exc)) from None
    entry = issued.entry
    if args.json:
        print_json(
            {
                "name": entry.name,
                "role": entry.role.value,
                "nodes": list(entry.nodes),
                "token": issued.token,
                "sha256": entry.sha256,
                "toml": entry.to_toml(),
                "env": entry.to_env(),
            }
        )
        return 0
    print(issued.token)
    print(
        f"# The token above is shown once: give it to {entry.name} now. Only its SHA-256 "
        "is configured.\n# Add this to the auth file (--auth-file / LLMGW_AUTH_FILE):"
    )
    print(entry.to_toml())
    print(f"# or add this entry to LLMGW_TOKENS (entries separated by ';'): {entry.to_env()}")
    return 0


def cmd_serve(app: App, args: argparse.Namespace) -> int:
    logs.configure(default_level="INFO")
    for name in ("interval", "stream_poll"):
        if getattr(args, name) <= 0:
            raise Refused(f"--{name.replace('_', '-')} must be a positive number of seconds")
    if args.catalog_max_age < 0:
        raise Refused("--catalog-max-age must not be negative")
    if not 0 <= args.port <= 65535:
        raise Refused(f"--port {args.port} is not a port number (0-65535)")
    try:
        policy = StalenessPolicy(
            stale_after=timedelta(seconds=args.stale_after),
            grace=timedelta(seconds=args.grace),
            preemption=args.preemption,
        )
        settings = ApiSettings.load(
            args.auth_file,
            reads_open=args.open_reads,
            stream_poll_s=args.stream_poll,
            catalog_max_age_s=args.catalog_max_age,
            policy=policy,
        )
    except (SettingsError, ValueError) as exc:
        raise Refused(str(exc)) from None

    from events import CatalogService
    from llmgw.api import server
    from llmgw.api.app import create_app
    from llmgw.api.background import SchedulerThread
    from llmgw.api.services import Services
    from scheduler.leader import leadership_for
    from scheduler.store import SchedulerStore

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
    if args.with_scheduler:
        scheduler = SchedulerThread.build(
            catalog=CatalogService(
                app.store, app.declared, app.config_label, snapshot_key=app.snapshot_key
            ),
            store=SchedulerStore(engine),
            policy=policy,
            leadership=leadership_for(app.settings.database_url),
            interval=args.interval,
            metrics=services.metrics,
        )
    try:
        sock = server.listen(args.host, args.port)
    except OSError as exc:
        raise Refused(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    where = server.url_of(sock)
    log.info("api.listening", url=where, reads_open=settings.reads_open, tokens=len(services.book))
    print(f"llmgw serve: listening on {where}", flush=True)
    # uvicorn raises the signal that stopped it again once it has shut down; this handler
    # takes it, so a stop by SIGTERM or Ctrl-C exits 0, like `llmgw daemon`.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stopped)
    if not server.run(create_app(services, scheduler=scheduler), sock, services.stopping):
        print("error: the API did not start (see the log above)", file=sys.stderr)
        return EXIT_REFUSED
    log.info("api.stopped")
    return 0


def _stopped(signum: int, frame: FrameType | None) -> None:
    del signum, frame
