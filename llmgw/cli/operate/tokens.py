"""``llmgw token new|list|revoke|limits|import``: bearer tokens, in the database.

A token issued with ``token new`` goes into the database's token table (its name, role,
scope and SHA-256; never the token, which is printed once), with a ``token.issued``
event in the catalog's log; ``token revoke`` marks it revoked with a ``token.revoked``
event. Every ``llmgw serve`` on the database takes either within a second, and every
gateway following one of them as soon (events.write.tokens, llmgw.api.runtime.live_tokens).

The auth file still works, for a bootstrap operator (the first token, before any
database token exists to call the API with) and for existing installs: ``token import``
moves its tokens into the database, and ``token new --append-to FILE`` still writes to
a file instead (deprecated: it applies when that server next starts, on that server
alone). A token revoked in the database is refused even where a file still lists it.

A client token's limits (``--rpm``, ``--tpm``, ``--max-inflight``, ``--budget``) are set
at issue and changed by ``token limits`` (a ``token.limits_changed`` event each);
every gateway enforces them (gateway.stages.quota) from the next token read, within a
second.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path
from typing import Any

from catalog.forms.client_limits import (
    NO_LIMITS,
    LimitChange,
    LimitError,
    apply,
    from_json,
    parse_change,
)
from llmgw.api.guards.tokens import TokenConfigError, TokenEntry, issue_token, parse_env_tokens
from llmgw.cli.operate import token_file
from llmgw.cli.shared.context import App, Refused, print_json
from llmgw.cli.shared.tables import table
from llmgw.settings import SettingsError

APPLIES = "every `llmgw serve` on this database and every gateway take it within a second"


def _actor(args: argparse.Namespace) -> str:
    if args.actor:
        return str(args.actor)
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (some containers)
        return "cli"


def _record(entry: TokenEntry) -> Any:
    from events.write.tokens import TokenRecord

    return TokenRecord(
        entry.name,
        entry.role.value,
        entry.sha256,
        entry.nodes,
        entry.models,
        entry.limits,
        priority_class=entry.priority_class,
        share=entry.share,
    )


def _change(args: argparse.Namespace) -> LimitChange:
    try:
        return parse_change(
            rpm=args.rpm, tpm=args.tpm, max_inflight=args.max_inflight, budget=args.budget
        )
    except LimitError as exc:
        raise Refused(str(exc)) from None


def cmd_token_new(app: App, args: argparse.Namespace) -> int:
    from events.write.tokens import TokenClash, issue

    try:
        models = [m.strip() for m in args.models.split(",") if m.strip()]
        limits = apply(NO_LIMITS, _change(args))
        issued = issue_token(
            args.name,
            args.role,
            args.node,
            models,
            limits,
            priority_class=args.priority_class,
            share=args.share,
        )
    except (TokenConfigError, LimitError) as exc:
        raise Refused(str(exc)) from None
    entry = issued.entry
    if args.append_to is not None:
        if not limits.empty:
            raise Refused(
                "--append-to: an auth file holds no limits; leave --append-to out to store "
                "the token, and its limits, in the database"
            )
        print(
            "warning: --append-to is deprecated: the token goes into that file only, and "
            "applies when that `llmgw serve` next starts, on it alone. Leave it out to "
            "store the token in the database, where every replica takes it at once.",
            file=sys.stderr,
        )
        try:
            token_file.append(args.append_to, entry)
        except SettingsError as exc:
            raise Refused(str(exc)) from None
    else:
        try:
            issue(app.store, _record(entry), actor=_actor(args), reason=args.reason)
        except TokenClash as exc:
            raise Refused(str(exc)) from None
    stored = "database" if args.append_to is None else str(args.append_to)
    if args.json:
        print_json(
            {
                "name": entry.name,
                "role": entry.role.value,
                "nodes": list(entry.nodes),
                "models": list(entry.models),
                "limits": entry.limits.to_json(),
                "priority_class": entry.priority_class,
                "share": entry.share,
                "token": issued.token,
                "sha256": entry.sha256,
                "stored": stored,
                "toml": entry.to_toml(),
                "env": entry.to_env(),
            }
        )
        return 0
    print(issued.token)
    if args.append_to is not None:
        print(
            f"# The token above is shown once: give it to {entry.name} now. Its SHA-256 "
            f"was appended to {args.append_to} (applies when `llmgw serve` next starts)."
        )
        return 0
    print(
        f"# The token above is shown once: give it to {entry.name} now. The database holds "
        f"its name, role and SHA-256, never the token: {APPLIES}."
    )
    return 0


def cmd_token_list(app: App, args: argparse.Namespace) -> int:
    from events.write.tokens import read_tokens

    rows: list[dict[str, Any]] = []
    for row in read_tokens(app.engine, revoked=args.all):
        if row.unreadable is not None:
            print(
                f"warning: tokens row {row.id} cannot be used ({row.unreadable}): every "
                "server skips it; revoke it or issue the token again",
                file=sys.stderr,
            )
        r = row.record
        rows.append(
            {
                "name": r.name,
                "role": r.role,
                "nodes": list(r.nodes),
                "models": list(r.models),
                "limits": r.limits.to_json(),
                "priority_class": r.priority_class,
                "share": r.share,
                "sha256": r.sha256[:12],
                "source": "database",
                "issued_by": row.issued_by,
                "issued_at": None if row.issued_at is None else row.issued_at.isoformat(),
                "revoked_by": row.revoked_by,
                "revoked_at": None if row.revoked_at is None else row.revoked_at.isoformat(),
            }
        )
    path = app.settings.auth_file
    sources: list[tuple[str, list[TokenEntry]]] = []
    try:
        if path is not None:
            sources.append((str(path), token_file.entries(path)))
        if os.environ.get("LLMGW_TOKENS"):
            sources.append(("LLMGW_TOKENS", parse_env_tokens(os.environ["LLMGW_TOKENS"])))
    except (SettingsError, TokenConfigError) as exc:
        raise Refused(str(exc)) from None
    for source, entries in sources:
        rows += [
            {
                "name": e.name,
                "role": e.role.value,
                "nodes": list(e.nodes),
                "models": list(e.models),
                "limits": {},
                "priority_class": e.priority_class,
                "share": e.share,
                "sha256": e.sha256[:12],
                "source": source,
            }
            for e in entries
        ]
    if args.json:
        print_json(rows)
        return 0
    headers = [
        "name", "role", "nodes", "models", "limits", "priority_class", "share", "sha256", "source"
    ]  # fmt: skip
    if args.all:
        headers += ["revoked_at", "revoked_by"]
    sys.stdout.write(
        table(
            headers,
            [[_cell(r, h) for h in headers] for r in rows],
        )
    )
    return 0


def cmd_token_revoke(app: App, args: argparse.Namespace) -> int:
    from events.write.tokens import revoke

    path = app.settings.auth_file
    # Read first: a file the server would refuse must not turn a revocation that took
    # place into an error; it matters only when the name is not in the database.
    in_file: list[TokenEntry] = []
    unusable: Refused | None = None
    if path is not None and path.exists():
        try:
            in_file = [e for e in _file_entries(path) if e.name == args.name]
        except Refused as exc:
            unusable = exc
    done = revoke(app.store, args.name, actor=_actor(args), reason=args.reason)
    listed = bool(in_file)
    if done is not None:
        role = done.change.role
        if args.json:
            print_json({"revoked": args.name, "role": role, "stored": "database"})
            return 0
        print(f"revoked {args.name} ({role}) in the database: {APPLIES}")
        if any(e.sha256 != done.sha256 for e in in_file):
            print(
                f"# warning: {path} lists another token named {args.name}, which stays in "
                f"force: `llmgw token revoke {args.name}` again removes it from the file "
                "(applies when `llmgw serve` next starts)",
                file=sys.stderr,
            )
        elif listed:
            print(
                f"# {path} still lists this token: refused anyway (the database records "
                "its revocation); remove the entry there to tidy up"
            )
        return 0
    if unusable is not None:
        raise unusable
    if not listed or path is None:
        raise Refused(
            f"no token named {args.name!r} is in force in the database"
            + ("" if path is None else f" or listed in {path}")
            + " (see `llmgw token list`); a token given in LLMGW_TOKENS is revoked by "
            "removing it there"
        )
    try:
        token_file.revoke(path, args.name)
    except SettingsError as exc:
        raise Refused(str(exc)) from None
    if args.json:
        print_json({"revoked": args.name, "auth_file": str(path), "stored": str(path)})
        return 0
    print(f"revoked {args.name} in {path}; it is refused once `llmgw serve` restarts")
    return 0


def cmd_token_limits(app: App, args: argparse.Namespace) -> int:
    from events.write.tokens import TokenClash, set_limits

    change = _change(args)
    if change.empty:
        raise Refused(
            "token limits: give at least one of --rpm, --tpm, --max-inflight, --budget "
            "(`none` removes a limit)"
        )
    try:
        done = set_limits(app.store, args.name, change, actor=_actor(args), reason=args.reason)
    except TokenClash as exc:
        raise Refused(str(exc)) from None
    if done is None:
        raise Refused(
            f"no token named {args.name!r} is in force in the database (see `llmgw token "
            "list`); limits are kept with database tokens only (`llmgw token import` moves "
            "an auth file's in)"
        )
    before = done.change.before
    after = done.change.limits
    if args.json:
        print_json(
            {
                "name": args.name,
                "before": None if before is None else before.to_json(),
                "after": after.to_json(),
                "changed": done.position != 0,
            }
        )
        return 0
    if done.position == 0:
        print(f"{args.name}: limits unchanged ({after.describe()})")
        return 0
    shown = "-" if before is None else before.describe()
    print(f"{args.name}: limits {shown} -> {after.describe()}; {APPLIES}")
    return 0


def _cell(row: dict[str, Any], header: str) -> str:
    value = row.get(header)
    if header in ("nodes", "models"):
        return ",".join(value or ()) or "-"
    if header == "limits":
        return from_json(value).describe()
    return str(value or "-")


def cmd_token_import(app: App, args: argparse.Namespace) -> int:
    from events.write.tokens import TokenClash, import_tokens

    path: Path = args.path
    if not path.exists():
        raise Refused(f"{path}: no such auth file")
    entries = _file_entries(path)
    try:
        outcome = import_tokens(
            app.store, [_record(e) for e in entries], actor=_actor(args), reason=args.reason
        )
    except TokenClash as exc:
        raise Refused(f"{path}: nothing imported: {exc}") from None
    if args.json:
        print_json({"imported": list(outcome.imported), "already": list(outcome.already)})
        return 0
    if outcome.imported:
        print(
            f"imported {len(outcome.imported)} token(s) from {path}: "
            f"{', '.join(outcome.imported)}; {APPLIES}"
        )
    if outcome.already:
        print(f"already in the database: {', '.join(outcome.already)}")
    if not entries:
        print(f"{path} lists no token: nothing to import")
    if outcome.imported or outcome.already:
        print(
            f"# Their revocation is now `llmgw token revoke NAME`, for every replica. {path} "
            "may keep them for a server of an older release, or drop them."
        )
    return 0


def _file_entries(path: Path) -> list[TokenEntry]:
    try:
        return token_file.entries(path)
    except SettingsError as exc:
        raise Refused(str(exc)) from None
