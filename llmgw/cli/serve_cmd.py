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
from types import FrameType

import structlog

from llmgw import logs
from llmgw.api.auth import Role, TokenConfigError, issue_token, parse_env_tokens
from llmgw.api.settings import ApiSettings
from llmgw.cli import token_file
from llmgw.cli.context import EXIT_REFUSED, App, Refused, print_json, table
from llmgw.cli.scheduler_cmds import staleness_flags
from llmgw.settings import SettingsError

log = structlog.get_logger("llmgw.api")


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "serve",
        parents=[parent, staleness_flags()],
        help="the control plane's HTTP API (agents report, operators change the catalog)",
        description="Serve the API over the same database as the other commands. Tokens come "
        "from --auth-file (env LLMGW_AUTH_FILE) and env LLMGW_TOKENS; see `llmgw token new`.",
    )
    p.add_argument(
        "--host",
        default=argparse.SUPPRESS,
        help="address to listen on ([server] host; default 127.0.0.1)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=argparse.SUPPRESS,
        help="port ([server] port; default 8080; 0 picks a free one)",
    )
    p.add_argument(
        "--auth-file",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="TOML file with the tokens (env LLMGW_AUTH_FILE; [auth] file)",
    )
    p.add_argument(
        "--open-reads",
        action="store_true",
        default=argparse.SUPPRESS,
        help="let GET routes answer without a token (writes always need one; env "
        "LLMGW_OPEN_READS=1; [auth] reads_open; or reads_open in the auth file)",
    )
    p.add_argument(
        "--with-scheduler",
        action="store_true",
        default=argparse.SUPPRESS,
        help="also run placement rounds in the background, as `llmgw daemon` would (the same "
        "leadership: one scheduler places per database; [server] with_scheduler)",
    )
    p.add_argument(
        "--interval",
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="time between rounds with --with-scheduler (env LLMGW_INTERVAL; [policy] "
        "interval; default 10s)",
    )
    p.add_argument(
        "--stream-poll",
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="how often an idle event stream looks for new events ([server] stream_poll; "
        "default 500ms)",
    )
    p.add_argument(
        "--catalog-max-age",
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="a read may be answered from a catalog checked against the log this long ago; "
        "changes through this server are seen at once ([server] catalog_max_age; default "
        "100ms; 0: check every read)",
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
    n.add_argument(
        "--role",
        required=True,
        choices=[r.value for r in Role],
        help="reader: GET routes; operator: also change the catalog; agent: report its nodes",
    )
    n.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NODE",
        help="a node an agent token may report (repeat for several; agents only)",
    )
    n.add_argument(
        "--append-to",
        type=Path,
        metavar="PATH",
        help="also append the entry to this auth file (created if missing; refused if the "
        "name is already there)",
    )
    n.add_argument("--json", action="store_true", help="as JSON, for programs")
    n.set_defaults(run=cmd_token_new)

    auth_file = argparse.ArgumentParser(add_help=False)
    auth_file.add_argument(
        "--auth-file",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="the auth file (env LLMGW_AUTH_FILE; [auth] file in llmgw.toml)",
    )
    ls = t_sub.add_parser(
        "list",
        parents=[parent, auth_file],
        help="the configured tokens: names, roles, nodes (never the tokens)",
    )
    ls.add_argument("--json", action="store_true", help="as JSON, for programs")
    ls.set_defaults(run=cmd_token_list)
    rv = t_sub.add_parser(
        "revoke",
        parents=[parent, auth_file],
        help="remove a token from the auth file (applies when the server next starts)",
    )
    rv.add_argument("name", help="the token's name (as in `llmgw token list`)")
    rv.add_argument("--json", action="store_true", help="as JSON, for programs")
    rv.set_defaults(run=cmd_token_revoke)


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
                "sha256": e.sha256[:12],
                "source": "LLMGW_TOKENS",
            }
            for e in extra
        ]
    if args.json:
        print_json(rows)
        return 0
    headers = ["name", "role", "nodes", "sha256", "source"]
    sys.stdout.write(
        table(
            headers,
            [
                [str(r[h]) if h != "nodes" else ",".join(r["nodes"]) or "-" for h in headers]
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
        issued = issue_token(args.name, args.role, args.node)
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
    logs.configure(default_level="INFO")
    conf = app.settings
    policy = conf.policy
    try:
        settings = ApiSettings.load(
            conf.auth_file,
            reads_open=conf.reads_open,
            stream_poll_s=conf.server.stream_poll_s,
            catalog_max_age_s=conf.server.catalog_max_age_s,
            policy=policy,
        )
    except (SettingsError, ValueError) as exc:
        raise Refused(str(exc)) from None

    from events.catalog_service import CatalogService
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
    if conf.server.with_scheduler:
        scheduler = SchedulerThread.build(
            catalog=CatalogService(
                app.store, app.declared, app.config_label, snapshot_key=app.snapshot_key
            ),
            store=SchedulerStore(engine),
            policy=policy,
            leadership=leadership_for(app.settings.database_url),
            interval=conf.interval_s,
            metrics=services.metrics,
        )
    host, port = conf.server.host, conf.server.port
    try:
        sock = server.listen(host, port)
    except OSError as exc:
        raise Refused(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
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
