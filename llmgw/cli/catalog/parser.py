"""The catalog's and the audit's commands: arguments and help (run by ``commands`` and
``audit``, imported only when one runs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from llmgw.cli.shared.parser import audit_args, position_or_time, time_arg


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    p = sub.add_parser("models", parents=[parent], help="the current catalog")
    p.add_argument("--json", action="store_true", help="full definitions, for programs")
    p.add_argument(
        "--show-secrets",
        action="store_true",
        help="show env values whose names look secret (*TOKEN*, *KEY*, ...) and keys in args "
        "as stored; "
        "by default they read [redacted]",
    )
    p.set_defaults(run="catalog.commands:cmd_models")

    p = sub.add_parser("add", parents=[parent], help="add one model or a list (all or nothing)")
    p.add_argument("file", type=Path, help="YAML or JSON: one model, or `models: [...]`")
    audit_args(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate against the catalog and show what the next round would place; "
        "record nothing",
    )
    p.add_argument("--json", action="store_true", help="the events recorded, for programs")
    p.set_defaults(run="catalog.commands:cmd_add")

    p = sub.add_parser(
        "apply",
        parents=[parent],
        help="add a model, or replace a runtime model's definition in one event",
    )
    p.add_argument("file", type=Path, help="YAML or JSON: one model definition")
    audit_args(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate against the catalog, show the diff and what the next round would do "
        "(place, roll out, remove); record nothing",
    )
    p.add_argument("--json", action="store_true", help="the outcome and the diff, for programs")
    p.set_defaults(run="catalog.commands:cmd_apply")

    p = sub.add_parser("remove", parents=[parent], help="remove a model added at runtime")
    p.add_argument("name", help="the model's name (as in `llmgw models`)")
    audit_args(p)
    p.add_argument("--json", action="store_true", help="the events recorded, for programs")
    p.set_defaults(run="catalog.commands:cmd_remove")

    p = sub.add_parser("resolve", parents=[parent], help="the canonical name of a name or alias")
    p.add_argument("name", help="a model name or alias")
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    p.set_defaults(run="catalog.commands:cmd_resolve")

    p = sub.add_parser("show", parents=[parent], help="the catalog as it was at a position or time")
    p.add_argument(
        "--at",
        metavar="POSITION|TIME",
        help="a log position, or a time (ISO-8601, or relative: 1h, yesterday)",
    )
    p.add_argument("--json", action="store_true", help="full definitions, for programs")
    p.add_argument(
        "--show-secrets",
        action="store_true",
        help="show env values whose names look secret (*TOKEN*, *KEY*, ...) and keys in args "
        "as stored; "
        "by default they read [redacted]",
    )
    p.set_defaults(run="catalog.commands:cmd_show")

    p = sub.add_parser("db", parents=[parent], help="the database schema")
    db_sub = p.add_subparsers(dest="db_command", required=True)
    u = db_sub.add_parser("upgrade", parents=[parent], help="migrate to the newest schema")
    u.add_argument("--json", action="store_true", help="as JSON, for programs")
    u.set_defaults(run="catalog.commands:cmd_db_upgrade")
    c = db_sub.add_parser("current", parents=[parent], help="the schema revision in use")
    c.add_argument("--json", action="store_true", help="as JSON, for programs")
    c.set_defaults(run="catalog.commands:cmd_db_current")


def register_audit(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "history",
        parents=[parent],
        help="who changed what, and when (filters combine)",
        description="The catalog's events in log order. Times are ISO-8601 (UTC unless they "
        "carry a zone), a time of day (14:45:30: today, local time, as `date` shows it) or "
        "relative (1h, 2d ago, today, yesterday); --since and --until are "
        "inclusive, and a date alone (or today, yesterday) means the whole day for --until "
        "(--since 2026-12-01 --until 2026-12-01 is that day).",
    )
    p.add_argument("--model", help="only events about this model (its name as recorded)")
    p.add_argument("--actor", help="only events by this actor (as given with --actor)")
    p.add_argument(
        "--type",
        help="only events of this type (model.added, model.replaced, model.removed, "
        "catalog.declared_changed, token.issued, token.revoked, token.limits_changed, "
        "usage.recorded)",
    )
    p.add_argument(
        "--usage",
        action="store_true",
        help="also the usage ledger's usage.recorded events (one a minute per client, "
        "model and replica with traffic), left out by default; --type usage.recorded "
        "lists them alone",
    )
    p.add_argument(
        "--since", type=time_arg, metavar="TIME", help="only events recorded at or after TIME"
    )
    p.add_argument(
        "--until", type=time_arg, metavar="TIME", help="only events recorded at or before TIME"
    )
    p.add_argument(
        "--placements",
        action="store_true",
        help="also the scheduler's placement events (placement.placed, placement.removed), "
        "merged by time; each line then says which log it is from",
    )
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="then keep printing new events as they are recorded, until Ctrl-C or until "
        "--until's time has passed (an --until already past is refused) (with --json, one "
        "object a line)",
    )
    p.add_argument("--json", action="store_true", help="a list of objects, for programs")
    p.set_defaults(run="catalog.history:cmd_history")

    p = sub.add_parser(
        "usage",
        parents=[parent],
        help="the usage ledger: requests and tokens per client and model, from the log",
        description="The sum of the gateways' usage events (usage.recorded) in the log: per "
        "client token and model asked (or --by client, model or day), the requests, their "
        "prompt, cached and completion tokens as the engines counted them, and their "
        "outcomes. A row that cannot be read is skipped and named. --since counts whole "
        "minutes, from the minute TIME falls in.",
    )
    p.add_argument("--client", metavar="C", help="only this client token (its name)")
    p.add_argument("--model", metavar="M", help="only this model (the model asked)")
    p.add_argument(
        "--since", type=time_arg, metavar="T", help="only the minutes from T's on (a time)"
    )
    p.add_argument(
        "--by",
        choices=["client", "model", "day"],
        help="one line per client, per model or per day (UTC) instead of per client and model",
    )
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    p.set_defaults(run="catalog.usage:cmd_usage")

    p = sub.add_parser("replay", parents=[parent], help="what applied, what was skipped and why")
    p.add_argument(
        "--until",
        type=position_or_time,
        metavar="POSITION|TIME",
        help="replay up to this log position, or the last event recorded at or before TIME",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="walk event by event: applied, or skipped with the catalog around it",
    )
    p.add_argument(
        "--strict", action="store_true", help="exit 1 when any event is skipped (for CI)"
    )
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    p.set_defaults(run="catalog.audit:cmd_replay")

    p = sub.add_parser(
        "diff", parents=[parent], help="models added, removed and changed between two points"
    )
    p.add_argument("frm", metavar="A", type=position_or_time, help="a log position or a time")
    p.add_argument("to", metavar="B", type=position_or_time, help="a log position or a time")
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    p.add_argument(
        "--show-secrets",
        action="store_true",
        help="show env values whose names look secret (*TOKEN*, *KEY*, ...) and keys in args "
        "as stored; "
        "by default they read [redacted]",
    )
    p.set_defaults(run="catalog.audit:cmd_diff")

    p = sub.add_parser(
        "verify", parents=[parent], help="check the log's hash chain; print its head hash"
    )
    p.add_argument(
        "--expect-head",
        metavar="HASH",
        help="a head hash recorded earlier: it must still be in the chain (catches truncation "
        "and wholesale rewrites, which the chain alone cannot)",
    )
    p.add_argument(
        "--adopt-unhashed",
        action="store_true",
        help="vouch for the rows after the chain's seal that carry no hash (an older release "
        "wrote them during an upgrade): recorded with --actor and --reason, both required",
    )
    p.add_argument("--actor", default="", help="who adopts (with --adopt-unhashed)")
    p.add_argument("--reason", default="", help="why the rows are genuine (with --adopt-unhashed)")
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    p.set_defaults(run="catalog.audit:cmd_verify")

    p = sub.add_parser(
        "snapshot", parents=[parent], help="store the replay state now, for fast start-up"
    )
    p.add_argument("--list", action="store_true", help="list the stored snapshots instead")
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    p.set_defaults(run="catalog.audit:cmd_snapshot")
