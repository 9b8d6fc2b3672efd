"""Autoscaling's commands: status, autoscale history/explain/backtest, bench (arguments and
help; run by ``commands`` and ``bench``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from llmgw.cli.shared.parser import time_arg


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    scale = sub.add_parser(
        "autoscale", parents=[parent], help="the autoscaler's decisions: history, explain, backtest"
    )
    scale_sub = scale.add_subparsers(dest="autoscale_command", required=True)
    p = scale_sub.add_parser(
        "history", parents=[parent], help="each decision with its reason and inputs"
    )
    p.add_argument("model", nargs="?", help="only this model (a name or alias)")
    p.add_argument("--since", type=time_arg, metavar="TIME", help="e.g. 1h, today, an ISO time")
    p.add_argument("--until", type=time_arg, metavar="TIME", help="up to this time")
    p.add_argument("--holds", action="store_true", help="also the holds worth knowing about")
    p.add_argument("--limit", type=int, default=200, help="the last N (default 200)")
    p.add_argument("--json", action="store_true", help="each decision with reason and inputs")
    p.set_defaults(run="autoscale.commands:cmd_history")
    p = scale_sub.add_parser("explain", parents=[parent], help="why a model has N replicas now")
    p.add_argument("model", help="a model name or alias")
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    p.set_defaults(run="autoscale.commands:cmd_explain")
    p = scale_sub.add_parser(
        "backtest",
        parents=[parent],
        help="replay the recorded signal windows under a policy, beside what happened",
    )
    p.add_argument(
        "--since", type=time_arg, required=True, metavar="TIME", help="from this time (1h, ISO)"
    )
    p.add_argument("--until", type=time_arg, metavar="TIME", help="default: now")
    p.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="a TOML file with an [autoscale] table (default: the policy that ran)",
    )
    p.add_argument("--json", action="store_true", help="both sides, per model, for programs")
    p.set_defaults(run="autoscale.commands:cmd_backtest")

    p = sub.add_parser(
        "bench",
        parents=[parent],
        help="measure one replica's capacity against the model's SLO, through a gateway",
    )
    p.add_argument("model", help="a model name or alias (it must declare an slo)")
    p.add_argument("--gateway", required=True, metavar="URL", help="e.g. http://gw:8000")
    p.add_argument(
        "--token-file", required=True, type=Path, metavar="FILE", help="a client token, one line"
    )
    p.add_argument("--profile", metavar="P", help="the profile measured (default: the first)")
    p.add_argument(
        "--max-concurrency", type=int, default=64, metavar="N", help="the last step (64)"
    )
    p.add_argument(
        "--start-concurrency", type=int, default=1, metavar="N", help="the first step (1)"
    )
    p.add_argument("--step-time", default="10s", metavar="DURATION", help="per step (10s)")
    p.add_argument("--max-tokens", type=int, default=32, metavar="N", help="per request (32)")
    p.add_argument(
        "--record",
        action="store_true",
        help="append the capacity as an event (needs the catalog's database); the profile's "
        "routing weight is derived from it unless the profile declares one",
    )
    p.add_argument("--json", action="store_true", help="the steps and capacity, for programs")
    p.set_defaults(run="autoscale.bench:cmd_bench")
