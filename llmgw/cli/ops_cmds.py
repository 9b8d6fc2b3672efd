"""Operator conveniences: `llmgw settings` (what is in force, and from where)."""

from __future__ import annotations

import argparse
import json

from llmgw.cli.context import App, print_json
from llmgw.cli.help import example


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "settings",
        parents=[parent],
        help="the settings in force (llmgw.toml, environment and flags resolved)",
        description="Every command, the server and the daemon resolve the same settings: "
        "flags, then the environment, then the settings file (--settings, LLMGW_SETTINGS or "
        "./llmgw.toml), then the defaults.",
        epilog=example("llmgw settings", "llmgw --settings /etc/llmgw/llmgw.toml settings --json"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    p.set_defaults(run=cmd_settings)


def cmd_settings(app: App, args: argparse.Namespace) -> int:
    data = app.settings.to_json()
    if args.json:
        print_json(data)
        return 0
    source = data.pop("settings_file")
    print(f"# settings file: {source or 'none (defaults, environment and flags)'}")
    for section, values in data.items():
        print(f"\n[{section}]")
        for key, value in values.items():
            shown = "(unset)" if value is None else json.dumps(value)
            print(f"{key} = {shown}")
    return 0
