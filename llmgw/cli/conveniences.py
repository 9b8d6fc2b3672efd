"""Operator conveniences: `llmgw settings` (what is in force) and `llmgw completion`."""

from __future__ import annotations

import argparse
import json
import sys

from llmgw.cli.completion import bash_script, zsh_script
from llmgw.cli.shared.context import App, print_json


def cmd_completion(app: App, args: argparse.Namespace) -> int:
    from llmgw.cli import build_parser

    parser = build_parser()
    script = bash_script(parser) if args.shell == "bash" else zsh_script(parser)
    sys.stdout.write(script)
    return 0


def cmd_settings(app: App, args: argparse.Namespace) -> int:
    from llmgw.agent_settings import resolve_agent

    data = app.settings.to_json()
    # What plain `llmgw agent` on this machine would run with: no agent flags here, so the
    # environment, then [agent] in the same file, then the defaults.
    agent = resolve_agent({}, app.settings.source)
    data["agent"] = agent.to_json()
    origins = {section: dict(keys) for section, keys in app.settings.origins.items()}
    origins["agent"] = dict(agent.origins)
    if args.json:
        print_json({**data, "origins": origins})
        return 0
    source = data.pop("settings_file")
    print(f"# settings file: {source or 'none (defaults, environment and flags)'}")
    print("# after each value: where it came from (flag, env VARIABLE, file or default)")
    for section, values in data.items():
        print(f"\n[{section}]")
        for key, value in values.items():
            shown = "(unset)" if value is None else json.dumps(value)
            origin = origins.get(section, {}).get(key)
            print(f"{key} = {shown}" + (f"  # {origin}" if origin else ""))
    return 0
