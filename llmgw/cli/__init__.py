"""``llmgw``: the command-line interface. It wires the packages together and holds no rules.

Exit status: 0 on success, 1 when a command is refused (the reason, naming the
model, on stderr), 2 for a usage error.

Here: ``main`` and the parser built from each command group's ``parser``
(``catalog``, ``scheduler``, ``autoscale``, ``gateway``, ``operate``), the ground they
share (``shared``), and the two commands that read the whole parser: ``settings`` and
``completion`` (``conveniences``, ``completion``). This module and the groups'
``parser`` modules import nothing but argparse: a command's own module, and the
database, models and web framework behind it, are imported when that command runs
(``llmgw.cli.shared.parser``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from llmgw.cli.autoscale import parser as parser_autoscale
from llmgw.cli.catalog import parser as parser_catalog
from llmgw.cli.gateway import parser as parser_gateway
from llmgw.cli.operate import parser as parser_operate
from llmgw.cli.scheduler import parser as parser_scheduler
from llmgw.cli.shared.help_text import add_examples
from llmgw.cli.shared.parser import Version, command, common_options


def build_parser() -> argparse.ArgumentParser:
    common = common_options()
    parser = argparse.ArgumentParser(
        prog="llmgw",
        parents=[common],
        description="Control plane for LLM-serving clusters: model catalog and placement.",
        epilog="Every command takes --json and --help (with an example). "
        'Shell completion: eval "$(llmgw completion bash)".',
    )
    parser.add_argument("--version", action=Version, help="show program's version number and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parser_catalog.register(sub, common)
    parser_catalog.register_audit(sub, common)
    parser_scheduler.register(sub, common)
    parser_scheduler.register_explain(sub, common)
    parser_scheduler.register_rollout(sub, common)
    parser_operate.register(sub, common)
    parser_operate.register_agent(sub, common)
    parser_gateway.register(sub, common)
    parser_operate.register_engine_check(sub, common)
    parser_operate.register_ops(sub, common)
    parser_autoscale.register(sub, common)
    add_examples(parser)
    _help_when_bare(parser)
    return parser


def _help_when_bare(parser: argparse.ArgumentParser) -> None:
    """``llmgw``, ``llmgw nodes``, ``llmgw token`` ... without a subcommand print their
    help (and exit 0) rather than argparse's "the following arguments are required:
    nodes_command": a command group alone is a question about what it holds. Every
    group, at any depth (checked for each by tests/unit/ops/test_cli_groups.py)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            action.required = False
            # A subcommand's own ``run`` wins (set after this one when it is parsed).
            parser.set_defaults(run=None, bare_group=parser)
            for child in {id(c): c for c in action.choices.values()}.values():
                _help_when_bare(child)


# Commands that run until stopped, whose info lines (rounds, requests, reconciles) are
# their record.
LOGS_AT_INFO = frozenset(
    {"operate.serve:cmd_serve", "scheduler.commands:cmd_daemon", "operate.agent:cmd_agent"}
)


def no_rich() -> None:
    """Keep structlog from loading rich in this process.

    structlog formats exceptions with rich whenever it can import it. llmgw does not
    depend on rich (a development tool, schemathesis, brings it), never calls it, and
    importing it (with pygments and attrs) cost about 90 ms of CPU in every command,
    server and agent started: more than half of what structlog itself costs. Marked
    absent, structlog takes its plain-traceback path, the one an install without rich
    (``make demo``) has always taken. Only here, at the command's entry: a process
    that embeds llmgw keeps whatever it imported.
    """
    sys.modules.setdefault("rich", None)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.run is None:  # a command group alone: its help
        args.bare_group.print_help()
        return 0
    no_rich()
    # Imported after parsing: --help, --version and usage errors never pay for them.
    from llmgw import logs
    from llmgw.cli.shared.context import (
        EXIT_INTERRUPTED,
        EXIT_REFUSED,
        App,
        SystemExitWith,
        guarded_output,
        refusals,
    )
    from llmgw.settings import Settings

    with guarded_output():
        # Once per process (loggers are cached on first use): the long-running
        # commands log what they do at info, the others only warnings.
        logs.configure(default_level="INFO" if args.run in LOGS_AT_INFO else "WARNING")
        try:
            with refusals():
                settings = Settings.resolve(
                    settings_file=getattr(args, "settings", None), flags=vars(args)
                )
                code: int = command(args.run)(App(settings), args)
        except SystemExitWith as exc:
            print(exc.message, file=sys.stderr)
            return exc.code
        except BrokenPipeError:  # `llmgw history | head`
            return EXIT_REFUSED
        except KeyboardInterrupt:
            # Ctrl-C: no traceback. --watch and --follow end on it with 0 themselves;
            # anywhere else the command was cut short (128 + SIGINT, as shells report it).
            return EXIT_INTERRUPTED
        return code


if __name__ == "__main__":
    sys.exit(main())
