"""What ``llmgw agent`` runs with: flags, then the environment, then ``[agent]`` in the
settings file, then the defaults, the same order as every other command's settings.

A node is usually set up once, by configuration management: one ``llmgw.toml`` (or
``/etc/llmgw/llmgw.toml`` named by ``LLMGW_SETTINGS``) next to the token file, and a
service unit that runs plain ``llmgw agent``::

    [agent]
    server = "http://cp.internal:8080"
    token_file = "agent.token"          # relative to this file
    labels = "zone=eu,rack=r7"
    interval = "10s"
    state_dir = "/var/lib/llmgw-agent"
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from llmgw.settings import KEYS, _convert, _read

# Each setting: the environment variable that may hold it, and its default.
AGENT_ENV: dict[str, str] = {
    "server": "LLMGW_SERVER",
    "token_file": "LLMGW_AGENT_TOKEN_FILE",
    "node": "LLMGW_NODE",
    "labels": "LLMGW_LABELS",
    "fabric": "LLMGW_FABRIC",
    "interval": "LLMGW_AGENT_INTERVAL",
    "state_dir": "LLMGW_AGENT_STATE_DIR",
    "gpus": "LLMGW_GPUS",
    "advertise": "LLMGW_ADVERTISE",
}


@dataclass(frozen=True, slots=True)
class AgentSettings:
    server: str | None
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


def resolve_agent(
    flags: Mapping[str, Any], source: Path | None, env: Mapping[str, str] | None = None
) -> AgentSettings:
    """The agent's settings; ``flags`` by argparse dest (None: not given), ``source`` the
    settings file in force (``Settings.source``). A bad value names where it came from."""
    env = os.environ if env is None else env
    table = _read(source).get("agent", {}) if source is not None else {}
    base = source.parent if source is not None else None

    def value(key: str, default: Any) -> Any:
        kind = KEYS["agent"][key]
        given = flags.get(key)
        if given is not None:
            return _seconds(_convert(kind, given, f"--{key.replace('_', '-')}", None))
        var = AGENT_ENV.get(key)
        if var is not None and env.get(var, "") != "":
            return _seconds(_convert(kind, env[var], var, None))
        if key in table:
            return _seconds(_convert(kind, table[key], f"{source}: [agent] {key}", base))
        return default

    node = value("node", None) or socket.gethostname()
    return AgentSettings(
        server=value("server", None),
        token_file=value("token_file", None),
        node=node,
        labels=value("labels", ""),
        fabric=value("fabric", None),
        interval_s=value("interval", 10.0),
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
    )


def _seconds(value: Any) -> Any:
    return value.total_seconds() if isinstance(value, timedelta) else value
