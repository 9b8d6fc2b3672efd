"""``llmgw agent``: the node agent (see ``agent/``). This module only wires flags to it."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from types import FrameType

import structlog

from llmgw import logs
from llmgw.cli.context import App, Refused

log = structlog.get_logger("llmgw.agent")


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
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
        metavar="URL",
        help="the control plane's URL (env LLMGW_SERVER)",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help="file holding this node's agent token "
        "(env LLMGW_AGENT_TOKEN_FILE; see `llmgw token new --role agent --node`)",
    )
    p.add_argument(
        "--node",
        help="the node's name (env LLMGW_NODE; default the host name)",
    )
    p.add_argument(
        "--labels",
        metavar="K=V,...",
        help="labels matched by profiles' node_selector (env LLMGW_LABELS)",
    )
    p.add_argument(
        "--fabric",
        help="nodes sharing a fabric can host one multi-node replica (env LLMGW_FABRIC)",
    )
    p.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help="report and reconcile every SECONDS (default 10)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="engine records and logs (env LLMGW_AGENT_STATE_DIR; "
        "default ~/.local/state/llmgw-agent/NODE)",
    )
    p.add_argument(
        "--gpus",
        metavar="CLASS:COUNT",
        help="the cards, when detection cannot see them (A100:8; none for no cards)",
    )
    p.add_argument(
        "--memory-gb",
        type=float,
        metavar="GB",
        help="host memory to report instead of the detected total",
    )
    p.add_argument(
        "--advertise",
        metavar="HOST",
        help="the address engines are reached at, in the endpoint "
        "URLs reported (env LLMGW_ADVERTISE; default the host's name)",
    )
    p.add_argument(
        "--engine-host",
        metavar="ADDR",
        help="the address engines listen on (default 0.0.0.0)",
    )
    p.add_argument(
        "--stop-grace",
        type=float,
        metavar="SECONDS",
        help="after SIGTERM, how long an engine has before SIGKILL (default 10)",
    )
    p.add_argument(
        "--restart-backoff",
        type=float,
        metavar="SECONDS",
        help="first wait before restarting a failed engine still placed here; "
        "doubles each time, up to 5 minutes (default 10)",
    )
    p.add_argument(
        "--log-max-mb",
        type=float,
        metavar="MB",
        help="rotate an engine's log once it passes MB megabytes (default 100)",
    )
    p.add_argument(
        "--log-keep",
        type=int,
        metavar="N",
        help="rotated copies of each engine log to keep, NAME.log.1 newest (default 3)",
    )
    p.add_argument(
        "--leave-engines",
        action="store_true",
        default=None,
        help="on SIGTERM, leave the engines running (the next agent adopts them) "
        "instead of stopping them",
    )
    p.set_defaults(run=cmd_agent)


def cmd_agent(app: App, args: argparse.Namespace) -> int:
    # The agent has no database: it talks to the control plane over HTTP. Of the
    # settings it takes only the file in force, for its [agent] table.
    logs.configure(default_level="INFO")
    from agent.client import ControlPlane
    from agent.inventory import InventoryError, detect
    from agent.logfiles import LogLimits
    from agent.reconcile import Backoff
    from agent.runtime import Agent, AgentConfig
    from agent.state import StateDirBusy
    from llmgw.agent_settings import resolve_agent
    from llmgw.settings import SettingsError

    try:
        s = resolve_agent(vars(args), app.settings.source)
    except SettingsError as exc:
        raise Refused(str(exc)) from None
    if not s.server:
        raise Refused(
            "--server is required (or env LLMGW_SERVER, or server in [agent] of llmgw.toml): "
            "the control plane's URL"
        )
    if s.token_file is None:
        raise Refused(
            "--token-file is required (or env LLMGW_AGENT_TOKEN_FILE, "
            "or token_file in [agent] of llmgw.toml)"
        )
    try:
        token = s.token_file.read_text(errors="replace").split()[0]
    except (OSError, IndexError):
        raise Refused(f"cannot read a token from {s.token_file}") from None
    try:
        inventory = detect(gpus=s.gpus, memory_gb=s.memory_gb)
        labels = _labels(s.labels)
    except (InventoryError, ValueError) as exc:
        raise Refused(str(exc)) from None
    state_dir = s.state_dir
    config = AgentConfig(
        node=s.node,
        state_dir=state_dir,
        labels=labels,
        fabric=s.fabric or None,
        interval=s.interval_s,
        engine_host=s.engine_host,
        advertise=s.advertise,
        stop_grace=s.stop_grace_s,
        leave_engines=s.leave_engines,
        backoff=Backoff(first_s=s.restart_backoff_s),
        logs=LogLimits(max_bytes=int(s.log_max_mb * 1024 * 1024), keep=s.log_keep),
    )
    try:
        agent = Agent(config, inventory, ControlPlane(s.server, token))
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
        server=s.server,
        gpu_class=inventory.gpu_class,
        gpus=inventory.gpus,
        devices=list(inventory.devices),
        memory_gb=inventory.memory_gb,
        cpus=inventory.cpus,
        inventory_source=inventory.source,
        notes=list(inventory.notes),
        state_dir=str(state_dir),
    )
    print(f"llmgw agent: node {config.node} reporting to {s.server}", flush=True)
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
