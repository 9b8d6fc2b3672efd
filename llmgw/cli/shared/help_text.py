"""Help text conventions: every command's --help ends with examples of its use.

The examples live here, by command path, so that a test can hold every command to
having some, and the command modules stay about what the commands do.
"""

from __future__ import annotations

import argparse

EXAMPLES: dict[str, tuple[str, ...]] = {
    "status": ("llmgw status", "llmgw status --watch", "llmgw status --json"),
    "autoscale": ("llmgw autoscale history chat", "llmgw autoscale explain chat"),
    "autoscale history": (
        "llmgw autoscale history --since 1h",
        "llmgw autoscale history chat --holds --json | jq '.[].reason'",
    ),
    "autoscale explain": ("llmgw autoscale explain chat", "llmgw autoscale explain chat --json"),
    "autoscale backtest": (
        "llmgw autoscale backtest --since 6h   # the policy that ran: the same decisions",
        "llmgw autoscale backtest --since yesterday --policy eager.toml",
        "llmgw autoscale backtest --since 1h --until 10m --json",
    ),
    "bench": (
        "llmgw bench chat --gateway http://gw:8000 --token-file bench.token",
        "llmgw bench chat --gateway http://gw:8000 --token-file t --profile a100 --record",
        "llmgw bench chat --gateway http://gw:8000 --token-file t --max-concurrency 16 --json",
    ),
    "models": ("llmgw models", "llmgw models --json | jq '.[].name'"),
    "add": (
        "llmgw add qwen-coder.yaml --reason 'trial for the IDE plugin'",
        "llmgw add qwen-coder.yaml --dry-run",
        "llmgw add models.yaml --key deploy-1234   # retried with the same key: recorded once",
    ),
    "remove": ("llmgw remove qwen2.5-coder-7b --reason 'trial over'",),
    "apply": (
        "llmgw apply qwen-coder.yaml --reason 'longer context'   # add, or replace in one event",
        "llmgw apply qwen-coder.yaml --dry-run   # the diff and the next round, nothing recorded",
        "llmgw apply qwen-coder.yaml --json",
    ),
    "rollout": ("llmgw rollout status qwen-coder",),
    "rollout status": ("llmgw rollout status qwen-coder", "llmgw rollout status qwen-coder --json"),
    "nodes cordon": ("llmgw nodes cordon gpu-7 --reason 'fan alarm'",),
    "nodes uncordon": ("llmgw nodes uncordon gpu-7",),
    "nodes drain": (
        "llmgw nodes drain gpu-7 --reason 'kernel upgrade'",
        "llmgw nodes drain gpu-7 --json",
    ),
    "agent": (
        "llmgw agent --server http://cp:8080 --token-file /etc/llmgw/agent.token",
        "llmgw agent --server http://cp:8080 --token-file t --gpus none --labels zone=eu-1",
    ),
    "gateway": (
        "llmgw gateway --server http://cp:8080 --token-file /etc/llmgw/gateway.token",
        "llmgw gateway --server http://cp:8080 --token-file t --host 0.0.0.0 --port 8090",
    ),
    "resolve": ("llmgw resolve coder", "llmgw resolve coder --json"),
    "engine-check": (
        "llmgw engine-check qwen-coder   # straight to its first ready replica",
        "llmgw engine-check qwen-coder --gateway http://gw:8000 --token-file client.token",
        "llmgw engine-check qwen-coder --json",
    ),
    "show": ("llmgw show --at 12", "llmgw show --at yesterday --json"),
    "db": ("llmgw db current", "llmgw db upgrade"),
    "db upgrade": ("llmgw db upgrade", "llmgw --db postgresql://llmgw@db/llmgw db upgrade"),
    "db current": ("llmgw db current --json",),
    "history": (
        "llmgw history --since 1h",
        "llmgw history --model qwen2.5-coder-7b --until yesterday",
        "llmgw history --placements --since today --json",
        "llmgw history --follow --placements   # then new events as they come, until Ctrl-C",
    ),
    "usage": (
        "llmgw usage --since today",
        "llmgw usage --client app-1 --by day --json",
        "llmgw usage --model chat --by client --since 1h",
    ),
    "replay": ("llmgw replay --explain", "llmgw replay --strict   # in CI: fail on a skip"),
    "diff": ("llmgw diff 3 12", "llmgw diff yesterday now --json"),
    "verify": ("llmgw verify", "llmgw verify --expect-head 5f1c..."),
    "snapshot": ("llmgw snapshot", "llmgw snapshot --list --json"),
    "nodes": ("llmgw nodes list", "llmgw nodes report nodes.yaml"),
    "nodes report": ("llmgw nodes report nodes.yaml",),
    "nodes list": (
        "llmgw nodes list",
        "llmgw nodes list --stale-after 30s --json",
        "llmgw nodes list --watch 5s   # redraw every 5 seconds until Ctrl-C",
    ),
    "nodes forget": ("llmgw nodes forget gpu-7",),
    "place": ("llmgw place --dry-run", "llmgw place --json"),
    "placements": (
        "llmgw placements --model qwen-coder",
        "llmgw placements --watch   # redraw every 2 seconds until Ctrl-C",
        "llmgw placements --watch 10 --json   # one JSON document a line per refresh",
    ),
    "daemon": ("llmgw daemon --interval 10s", "llmgw daemon --once"),
    "explain": ("llmgw explain coder", "llmgw explain coder --round 12 --json"),
    "serve": (
        "llmgw serve --auth-file auth.toml",
        "llmgw serve --host 0.0.0.0 --port 8080 --with-scheduler",
    ),
    "token": (
        "llmgw token new alice --role operator --actor root",
        "llmgw token list",
        "llmgw token import auth.toml",
    ),
    "token new": (
        "llmgw token new alice --role operator --reason 'on call'",
        "llmgw token new agent-gpu-7 --role agent --node gpu-7",
        "llmgw token new app-1 --role client --models chat,coder",
        "llmgw token new app-2 --role client --rpm 600 --tpm 200000 --tpm chat=100000 "
        "--max-inflight 32 --budget 50M/30d",
    ),
    "token list": ("llmgw token list", "llmgw token list --all --auth-file auth.toml"),
    "token limits": (
        "llmgw token limits app-1 --rpm 1200 --reason 'launch week'",
        "llmgw token limits app-1 --tpm chat=none --budget none",
    ),
    "token revoke": ("llmgw token revoke alice --reason 'left the team'",),
    "token import": ("llmgw token import /etc/llmgw/auth.toml --actor root",),
    "settings": ("llmgw settings", "llmgw --settings /etc/llmgw/llmgw.toml settings --json"),
    "completion": (
        'eval "$(llmgw completion bash)"',
        "llmgw completion zsh > ~/.zfunc/_llmgw",
    ),
}


def example(*lines: str) -> str:
    """An epilog of example invocations."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


class Formatter(argparse.HelpFormatter):
    """Wraps prose, but keeps example lines (indented) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(
            indent + line
            if line.startswith("  ") or line.endswith(":")
            else super(Formatter, self)._fill_text(line, width, indent)
            for line in text.split("\n")
        )


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every command's parser, by its path ("nodes list")."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    here = f"{path} {name}".strip()
                    found[here] = sub
                    walk(sub, here)

    walk(parser, "")
    return found


def add_examples(parser: argparse.ArgumentParser) -> None:
    for path, sub in subcommands(parser).items():
        sub.formatter_class = Formatter
        lines = EXAMPLES.get(path)
        if lines and not sub.epilog:
            sub.epilog = example(*lines)
