"""What every command's parser shares: global options, --version, and lazy commands.

A command's arguments and help live in the light ``parser_*`` modules; the code
that runs it (and what that code imports: SQLAlchemy, pydantic, the web
framework) is named by a string, ``"module:function"`` under ``llmgw.cli``, and
imported only when that command runs. ``llmgw --help`` and ``--version`` import
argparse and these modules, nothing more (tests/unit/ops/test_cli_imports.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmgw.cli.shared.context import App

Command = Callable[["App", argparse.Namespace], int]


def command(name: str) -> Command:
    """The function a parser's ``run`` default names ("catalog.commands:cmd_models")."""
    module, _, function = name.partition(":")
    found: Command = getattr(importlib.import_module(f"llmgw.cli.{module}"), function)
    return found


class Version(argparse.Action):
    """``--version``, looking the version up only when asked (importlib.metadata is not free)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("llmgw-control")
        except PackageNotFoundError:
            found = "0"
        # On stdout, as `--version` is everywhere: `v=$(llmgw --version)` must read it
        # (argparse's own version action also prints it there).
        sys.stdout.write(f"llmgw {found}\n")
        parser.exit()


def common_options() -> argparse.ArgumentParser:
    """The global options, accepted before or after the command name."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db",
        default=argparse.SUPPRESS,
        metavar="URL",
        help="database URL, e.g. sqlite:///llmgw.db or postgresql://user@host/llmgw "
        "(env LLMGW_DATABASE_URL; [database] url in llmgw.toml)",
    )
    common.add_argument(
        "--config",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="declared catalog file (env LLMGW_CONFIG; [catalog] file in llmgw.toml; "
        "default ./catalog.yaml when present)",
    )
    common.add_argument(
        "--settings",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="the settings file (env LLMGW_SETTINGS; default ./llmgw.toml when present); "
        "flags win over the environment, which wins over the file",
    )
    return common


def audit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--actor",
        default=None,
        help="who makes the change (recorded in the log; default: the login user)",
    )
    p.add_argument("--reason", default="", help="why (recorded in the log)")
    p.add_argument("--key", help="idempotency key: the same key again is recorded once")


def staleness_flags() -> argparse.ArgumentParser:
    """--stale-after and --grace: unset here, so that llmgw.toml and the environment apply
    (llmgw.settings resolves them once for every command, the server and the daemon).
    The commands that judge nodes (status, nodes list, place, explain) judge by the policy
    the server recorded; given to one of them, a flag wins over it (llmgw.policy_view)."""
    staleness = argparse.ArgumentParser(add_help=False)
    staleness.add_argument(
        "--stale-after",
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="a node silent this long gets nothing new, e.g. 90s (env LLMGW_STALE_AFTER; "
        "[policy] stale_after; default 90s; status, nodes list, place and explain judge by "
        "the policy the server recorded unless this flag is given)",
    )
    staleness.add_argument(
        "--grace",
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="further silence after which its replicas move, e.g. 5m (env LLMGW_GRACE; "
        "[policy] grace; default 5m)",
    )
    staleness.add_argument(
        "--no-preemption",
        dest="preemption",
        action="store_false",
        default=argparse.SUPPRESS,
        help="never evict lower-priority replicas, cluster-wide (env LLMGW_PREEMPTION=0; "
        "[policy] preemption = false; default on)",
    )
    staleness.add_argument(
        "--no-defragment",
        dest="defragment",
        action="store_false",
        default=argparse.SUPPRESS,
        help="never move running replicas to make room or repair a spread, cluster-wide "
        "(env LLMGW_DEFRAGMENT=0; [scheduler] defragment = false; default on)",
    )
    staleness.add_argument(
        "--repair-spread",
        dest="repair_spread",
        action="store_true",
        default=argparse.SUPPRESS,
        help="repair every movable model's worsened spread (one surge-first move at a time), "
        "not only models with disruption.repair_spread (env LLMGW_REPAIR_SPREAD=1; "
        "[scheduler] repair_spread = true; default off)",
    )
    staleness.add_argument(
        "--leadership-lease",
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="on PostgreSQL, how long the scheduler's leadership lease lasts unrenewed: a "
        "frozen leader is replaced within it plus one interval (env LLMGW_LEADERSHIP_LEASE; "
        "[scheduler] leadership_lease; default twice the interval, at least 2s)",
    )
    return staleness


def watch_flag(p: argparse.ArgumentParser) -> None:
    """``--watch [SECONDS]``: redraw until Ctrl-C (llmgw.cli.shared.live)."""
    p.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        default=None,
        type=watch_seconds,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2; also 5s, 1m) until Ctrl-C; "
        "with --json, one JSON document a line per refresh",
    )


def watch_seconds(text: str) -> float:
    from llmgw.cli.shared.live import watch_seconds as parse

    return parse(text)


def position_or_time(text: str) -> str:
    """Checked at parse time (a usage error, exit 2); resolved against the log later."""
    return text if text.isdigit() else time_arg(text)


def time_arg(text: str) -> str:
    from llmgw.cli.shared.times import BadTime, parse_when

    try:
        parse_when(text)
    except BadTime as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
