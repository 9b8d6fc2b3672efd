"""Operator conveniences: `llmgw settings` (what is in force) and `llmgw completion`."""

from __future__ import annotations

import argparse
import json
import sys

from llmgw.cli.completion import bash_script, zsh_script
from llmgw.cli.context import App, print_json


def cmd_completion(app: App, args: argparse.Namespace) -> int:
    from llmgw.cli import build_parser

    parser = build_parser()
    script = bash_script(parser) if args.shell == "bash" else zsh_script(parser)
    sys.stdout.write(script)
    return 0


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
