"""``llmgw agent``: the node agent (see ``agent/``). This module only wires flags to it."""

from __future__ import annotations

import argparse
import os
import signal
import socket
from pathlib import Path
from types import FrameType

import structlog

from llmgw import logs
from llmgw.cli.context import App, Refused

log = structlog.get_logger("llmgw.agent")


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    env = os.environ.get
    p = sub.add_parser(
        "agent",
        parents=[parent],
        help="run the node agent: report this node, run the engines placed on it",
        description="One per node. Reports the node's inventory (the heartbeat) with the state "
        "of its replicas, reads its placements and starts or stops engines to match. Example: "
        "llmgw agent --server http://cp:8080 --token-file /etc/llmgw/agent.token",
    )
    p.add_argument(
        "--server",
        default=env("LLMGW_SERVER"),
        metavar="URL",
        help="the control plane's URL (env LLMGW_SERVER)",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        default=env("LLMGW_AGENT_TOKEN_FILE"),
        metavar="PATH",
        help="file holding this node's agent token "
        "(env LLMGW_AGENT_TOKEN_FILE; see `llmgw token new --role agent --node`)",
    )
    p.add_argument(
        "--node",
        default=env("LLMGW_NODE") or socket.gethostname(),
        help="the node's name (env LLMGW_NODE; default the host name)",
    )
    p.add_argument(
        "--labels",
        default=env("LLMGW_LABELS", ""),
        metavar="K=V,...",
        help="labels matched by profiles' node_selector (env LLMGW_LABELS)",
    )
    p.add_argument(
        "--fabric",
        default=env("LLMGW_FABRIC"),
        help="nodes sharing a fabric can host one multi-node replica (env LLMGW_FABRIC)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=float(env("LLMGW_AGENT_INTERVAL", "10")),
        metavar="SECONDS",
        help="report and reconcile every SECONDS (default 10)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=env("LLMGW_AGENT_STATE_DIR"),
        metavar="DIR",
        help="engine records and logs (env LLMGW_AGENT_STATE_DIR; "
        "default ~/.local/state/llmgw-agent/NODE)",
    )
    p.add_argument(
        "--gpus",
        default=env("LLMGW_GPUS"),
        metavar="CLASS:COUNT",
        help="the cards, when detection cannot see them (A100:8; none for no cards)",
    )
    p.add_argument(
        "--memory-gb",
        type=float,
        default=None,
        metavar="GB",
        help="host memory to report instead of the detected total",
    )
    p.add_argument(
        "--advertise",
        default=env("LLMGW_ADVERTISE"),
        metavar="HOST",
        help="the address engines are reached at, in the endpoint "
        "URLs reported (env LLMGW_ADVERTISE; default the host's name)",
    )
    p.add_argument(
        "--engine-host",
        default="0.0.0.0",
        metavar="ADDR",
        help="the address engines listen on (default 0.0.0.0)",
    )
    p.add_argument(
        "--stop-grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="after SIGTERM, how long an engine has before SIGKILL (default 10)",
    )
    p.add_argument(
        "--restart-backoff",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="first wait before restarting a failed engine still placed here; "
        "doubles each time, up to 5 minutes (default 10)",
    )
    p.add_argument(
        "--log-max-mb",
        type=float,
        default=100.0,
        metavar="MB",
        help="rotate an engine's log once it passes MB megabytes (default 100)",
    )
    p.add_argument(
        "--log-keep",
        type=int,
        default=3,
        metavar="N",
        help="rotated copies of each engine log to keep, NAME.log.1 newest (default 3)",
    )
    p.add_argument(
        "--leave-engines",
        action="store_true",
        help="on SIGTERM, leave the engines running (the next agent adopts them) "
        "instead of stopping them",
    )
    p.set_defaults(run=cmd_agent)


def cmd_agent(app: App, args: argparse.Namespace) -> int:
    del app  # the agent has no database: it talks to the control plane over HTTP
    logs.configure(default_level="INFO")
    from agent.client import ControlPlane
    from agent.inventory import InventoryError, detect
    from agent.logfiles import LogLimits
    from agent.reconcile import Backoff
    from agent.runtime import Agent, AgentConfig
    from agent.state import StateDirBusy

    if not args.server:
        raise Refused("--server is required (or env LLMGW_SERVER): the control plane's URL")
    if args.token_file is None:
        raise Refused("--token-file is required (or env LLMGW_AGENT_TOKEN_FILE)")
    for name in ("interval", "stop_grace", "restart_backoff"):
        if getattr(args, name) <= 0:
            raise Refused(f"--{name.replace('_', '-')} must be a positive number of seconds")
    if not args.log_max_mb > 0:
        raise Refused("--log-max-mb must be a positive number of megabytes")
    if args.log_keep < 0:
        raise Refused("--log-keep must be 0 or more")
    try:
        token = args.token_file.read_text(errors="replace").split()[0]
    except (OSError, IndexError):
        raise Refused(f"cannot read a token from {args.token_file}") from None
    try:
        inventory = detect(gpus=args.gpus, memory_gb=args.memory_gb)
        labels = _labels(args.labels)
    except (InventoryError, ValueError) as exc:
        raise Refused(str(exc)) from None
    state_dir = args.state_dir or Path.home() / ".local/state/llmgw-agent" / args.node
    config = AgentConfig(
        node=args.node,
        state_dir=state_dir,
        labels=labels,
        fabric=args.fabric or None,
        interval=args.interval,
        engine_host=args.engine_host,
        advertise=args.advertise or socket.getfqdn(),
        stop_grace=args.stop_grace,
        leave_engines=args.leave_engines,
        backoff=Backoff(first_s=args.restart_backoff),
        logs=LogLimits(max_bytes=int(args.log_max_mb * 1024 * 1024), keep=args.log_keep),
    )
    try:
        agent = Agent(config, inventory, ControlPlane(args.server, token))
        agent.state.lock()
    except (OSError, StateDirBusy) as exc:
        raise Refused(f"cannot use the state dir {state_dir}: {exc}") from None

    def stopping(signum: int, frame: FrameType | None) -> None:
        del frame
        log.info("agent.stopping", signal=signal.Signals(signum).name)
        agent.stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stopping)
    log.info(
        "agent.started",
        node=config.node,
        server=args.server,
        gpu_class=inventory.gpu_class,
        gpus=inventory.gpus,
        devices=list(inventory.devices),
        memory_gb=inventory.memory_gb,
        cpus=inventory.cpus,
        inventory_source=inventory.source,
        notes=list(inventory.notes),
        state_dir=str(state_dir),
    )
    print(f"llmgw agent: node {config.node} reporting to {args.server}", flush=True)
    agent.run()
    log.info("agent.stopped", node=config.node)
    return 0


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--labels item {item!r} is not KEY=VALUE; write zone=eu,rack=r7")
        labels[key.strip()] = value.strip()
    return labels
