"""``llmgw``: the command-line interface. It wires the packages together and holds no rules.

Exit status: 0 on success, 1 when a command is refused (the reason, naming the
model, on stderr), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from llmgw import logs
from llmgw.cli import (
    agent_cmd,
    audit_cmds,
    catalog_cmds,
    explain_cmd,
    lifecycle_cmds,
    scheduler_cmds,
    serve_cmd,
)
from llmgw.cli.context import EXIT_REFUSED, App, SystemExitWith, guarded_output, refusals
from llmgw.settings import Settings


def build_parser() -> argparse.ArgumentParser:
    # The global options are accepted before or after the command name.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db", default=argparse.SUPPRESS, help="database URL (env LLMGW_DATABASE_URL)"
    )
    common.add_argument(
        "--config",
        default=argparse.SUPPRESS,
        help="declared catalog file (env LLMGW_CONFIG; default ./catalog.yaml when present)",
    )
    parser = argparse.ArgumentParser(
        prog="llmgw",
        parents=[common],
        description="Control plane for LLM-serving clusters: model catalog and placement.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    catalog_cmds.register(sub, common)
    audit_cmds.register(sub, common)
    scheduler_cmds.register(sub, common)
    explain_cmd.register(sub, common)
    lifecycle_cmds.register(sub, common)
    serve_cmd.register(sub, common)
    agent_cmd.register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with guarded_output():
        logs.configure()
        app = App(Settings.resolve(getattr(args, "db", None), getattr(args, "config", None)))
        try:
            with refusals():
                code: int = args.run(app, args)
        except SystemExitWith as exc:
            print(exc.message, file=sys.stderr)
            return exc.code
        except BrokenPipeError:  # `llmgw history | head`
            return EXIT_REFUSED
        return code


if __name__ == "__main__":
    sys.exit(main())
