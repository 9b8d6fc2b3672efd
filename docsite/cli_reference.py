"""The CLI reference page, from the argument parser itself (``llmgw.cli.build_parser``).

Every command's ``--help`` as ``llmgw COMMAND --help`` prints it (usage, arguments,
examples), at a fixed width so that the page does not depend on the terminal that built it.
"""

from __future__ import annotations

import argparse
import os

WIDTH = "100"


def render() -> str:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH  # argparse wraps help to $COLUMNS
    try:
        from llmgw.cli import build_parser
        from llmgw.cli.shared.help_text import subcommands

        parser = build_parser()
        commands = subcommands(parser)
        lines = [
            "# CLI reference",
            "",
            "Generated from the argument parser (`llmgw.cli.build_parser`) when this site was "
            "built: each command's `--help`, exactly as `llmgw COMMAND --help` prints it. "
            "Global options (`--db`, `--config`, `--settings`, ...) are taken before or after "
            "the command. Exit status: `0` success, `1` refused (the reason on stderr names "
            "the model and what to do), `2` usage error.",
            "",
            "| command | what it does |",
            "|---|---|",
        ]
        for path in commands:
            lines.append(f"| [`llmgw {path}`](#{_anchor(path)}) | {_summary(parser, path)} |")
        lines += ["", "## llmgw", "", "```text", parser.format_help().rstrip(), "```", ""]
        for path, sub in commands.items():
            lines += [f"## llmgw {path}", "", "```text", sub.format_help().rstrip(), "```", ""]
        return "\n".join(lines)
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved


def _anchor(path: str) -> str:
    return "llmgw-" + path.replace(" ", "-")


def _summary(parser: argparse.ArgumentParser, path: str) -> str:
    """The command's one-line help, as its parent lists it."""
    *parents, name = path.split(" ")
    node = parser
    for part in parents:
        node = _choices(node)[part]
    for action in node._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.dest == name:
                    return (choice.help or "").replace("|", "\\|")
    return ""


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


if __name__ == "__main__":
    print(render())
