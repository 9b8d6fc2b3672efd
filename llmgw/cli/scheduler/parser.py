"""The scheduler's commands: nodes, place, placements, daemon, explain, rollout
(arguments and help; run by ``commands``, ``explain`` and ``lifecycle``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from llmgw.cli.shared.parser import staleness_flags, watch_flag


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    staleness = staleness_flags()

    nodes = sub.add_parser("nodes", parents=[parent], help="the node inventory")
    nodes_sub = nodes.add_subparsers(dest="nodes_command", required=True)
    p = nodes_sub.add_parser("report", parents=[parent], help="record an agent's report")
    p.add_argument("file", type=Path, help="YAML or JSON: one node, a list, or `nodes: [...]`")
    p.add_argument("--json", action="store_true", help="the nodes recorded, for programs")
    p.set_defaults(run="scheduler.commands:cmd_nodes_report")
    p = nodes_sub.add_parser("list", parents=[parent, staleness], help="nodes as reported")
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    watch_flag(p)
    p.set_defaults(run="scheduler.commands:cmd_nodes_list")
    p = nodes_sub.add_parser("forget", parents=[parent], help="drop a decommissioned node")
    p.add_argument("name", help="the node's name (as in `llmgw nodes list`)")
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    p.set_defaults(run="scheduler.commands:cmd_nodes_forget")
    register_nodes(nodes_sub, parent)

    p = sub.add_parser("place", parents=[parent, staleness], help="run one placement round")
    p.add_argument("--dry-run", action="store_true", help="plan and show, write nothing")
    p.add_argument("--json", action="store_true", help="the plan, for programs")
    p.set_defaults(run="scheduler.commands:cmd_place")

    p = sub.add_parser(
        "placements", parents=[parent], help="where every replica runs now, and its state"
    )
    p.add_argument("--node", metavar="NAME", help="only replicas on this node")
    p.add_argument("--model", metavar="NAME", help="only replicas of this model (name or alias)")
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    watch_flag(p)
    p.set_defaults(run="scheduler.commands:cmd_placements")

    p = sub.add_parser("daemon", parents=[parent, staleness], help="place in the background")
    p.add_argument(
        "--interval",
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="time between rounds, e.g. 10s (env LLMGW_INTERVAL; [policy] interval; default 10s)",
    )
    p.add_argument("--once", action="store_true", help="run one round and exit")
    p.set_defaults(run="scheduler.commands:cmd_daemon")


def register_explain(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "explain",
        parents=[parent, staleness_flags()],
        help="why each replica of a model is where it is (now, or in a recorded round)",
    )
    p.add_argument("model", help="a model name or alias")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--at", metavar="TIME", help="the last round recorded at or before TIME")
    when.add_argument("--round", type=int, metavar="N", help="recorded round N")
    p.add_argument("--json", action="store_true", help="as JSON, for programs")
    p.set_defaults(run="scheduler.explain:cmd_explain")


def register_nodes(
    nodes_sub: argparse._SubParsersAction[argparse.ArgumentParser],
    parent: argparse.ArgumentParser,
) -> None:
    helps = {
        "cordon": "take no new replicas on a node; what runs there stays",
        "uncordon": "put a cordoned or draining node back in service",
        "drain": "move a node's replicas elsewhere, surge-first, and take no new ones",
    }
    for action, text in helps.items():
        p = nodes_sub.add_parser(action, parents=[parent], help=text)
        p.add_argument("name", help="the node, as its agent reports it")
        p.add_argument("--reason", default="", help="why (recorded with the event)")
        p.add_argument(
            "--actor", default="", help="who (recorded with the event; default: the login user)"
        )
        p.add_argument("--json", action="store_true", help="as JSON, for programs")
        p.set_defaults(run="scheduler.lifecycle:cmd_service", action=action)


def register_rollout(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    p = sub.add_parser("rollout", parents=[parent], help="replacing a model's replicas")
    rsub = p.add_subparsers(dest="rollout_command", required=True)
    s = rsub.add_parser(
        "status", parents=[parent], help="old and new replicas, and what the rollout waits for"
    )
    s.add_argument("model", help="a model name or alias")
    s.add_argument("--json", action="store_true", help="as JSON, for programs")
    s.set_defaults(run="scheduler.lifecycle:cmd_rollout_status")
