"""``llmgw``: the command-line interface. It wires the packages together and holds no rules.

Exit status: 0 on success, 1 when a command is refused (the reason, naming the
model, on stderr), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from llmgw import logs
from llmgw.cli import (
    agent_cmd,
    audit_cmds,
    catalog_cmds,
    explain_cmd,
    lifecycle_cmds,
    ops_cmds,
    scheduler_cmds,
    serve_cmd,
)
from llmgw.cli.context import EXIT_REFUSED, App, SystemExitWith, guarded_output, refusals
from llmgw.cli.help import add_examples
from llmgw.settings import Settings


def build_parser() -> argparse.ArgumentParser:
    # The global options are accepted before or after the command name.
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
    parser = argparse.ArgumentParser(
        prog="llmgw",
        parents=[common],
        description="Control plane for LLM-serving clusters: model catalog and placement.",
        epilog="Every command takes --json and --help (with an example). "
        'Shell completion: eval "$(llmgw completion bash)".',
    )
    parser.add_argument("--version", action="version", version=f"llmgw {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    catalog_cmds.register(sub, common)
    audit_cmds.register(sub, common)
    scheduler_cmds.register(sub, common)
    explain_cmd.register(sub, common)
    lifecycle_cmds.register(sub, common)
    serve_cmd.register(sub, common)
    agent_cmd.register(sub, common)
    ops_cmds.register(sub, common)
    add_examples(parser)
    return parser


def _version() -> str:
    try:
        return version("llmgw-control")
    except PackageNotFoundError:
        return "0"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with guarded_output():
        logs.configure()
        try:
            with refusals():
                settings = Settings.resolve(
                    settings_file=getattr(args, "settings", None), flags=vars(args)
                )
                code: int = args.run(App(settings), args)
        except SystemExitWith as exc:
            print(exc.message, file=sys.stderr)
            return exc.code
        except BrokenPipeError:  # `llmgw history | head`
            return EXIT_REFUSED
        return code


if __name__ == "__main__":
    sys.exit(main())
