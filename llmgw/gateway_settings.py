"""What ``llmgw gateway`` runs with: flags, then the environment, then ``[gateway]`` in the
settings file, then the defaults, the same order as every other command's settings::

    [gateway]
    server = "http://cp.internal:8080"  # or a list of the replicas' URLs
    token_file = "gateway.token"        # relative to this file
    host = "0.0.0.0"
    port = 8090
    attempts = 3                        # replicas tried per model before its fallbacks
    connect_timeout = "2s"
    read_timeout = "5m"
    max_wait = "5m"                     # for a starting replica, at most
    signals_interval = "5s"
    usage_flush = "1s"                  # the usage ledger's flush to the control plane (<= 60s)
    resync = "5s"
    max_body_mb = 8
    max_answer_mb = 256                 # an engine's answer toward the client, at most
    max_answer_time = "1h"              # from sending to an engine to its last byte
    slow_start = "30s"                  # a new replica's weight rises over this (0: off)
    admin_open = false                  # true: /metrics and /routing take no token
    workers = 1                         # processes serving the port (one core each; <= 64)
    max_connections = 800               # per worker; then the oldest not being served give way
    queue_max_length = 1024             # requests waiting for a full model's free slot
    queue_max_wait = "60s"              # at most (or the client's shorter timeout)
    queue_starvation = "30s"            # a lower class waits at most this long
    queue_hold = "5s"                   # waits for the replica its prefix/session chose
    # slot_share = 0.5                  # a fixed part of each replica's slots (default:
                                        # dealt among the live gateways)
    borrow = true                       # fill others' idle slots, read on the engines
    secrets_dir = "/etc/llmgw/secrets"  # engines' keys, a file per secret (as the agent's)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from agent.secrets import read_secret
from autoscale.signals import MAX_WORKERS
from gateway.settings import MAX_USAGE_FLUSH_S, GatewaySettings
from llmgw.settings import KEYS, SettingsError, _convert, _read

GATEWAY_ENV: dict[str, str] = {
    "server": "LLMGW_SERVER",
    "token_file": "LLMGW_GATEWAY_TOKEN_FILE",
    "host": "LLMGW_GATEWAY_HOST",
    "port": "LLMGW_GATEWAY_PORT",
    "gateway_id": "LLMGW_GATEWAY_ID",
    "admin_open": "LLMGW_GATEWAY_ADMIN_OPEN",
    "workers": "LLMGW_GATEWAY_WORKERS",
    "secrets_dir": "LLMGW_GATEWAY_SECRETS_DIR",
}


def resolve_gateway(
    flags: Mapping[str, Any], source: Path | None, env: Mapping[str, str] | None = None
) -> GatewaySettings:
    """The gateway's settings; ``flags`` by argparse dest (None: not given), ``source`` the
    settings file in force. A bad value names where it came from."""
    env = os.environ if env is None else env
    table = _read(source).get("gateway", {}) if source is not None else {}
    base = source.parent if source is not None else None

    def value(key: str, default: Any) -> Any:
        kind = KEYS["gateway"][key]
        given = flags.get(key)
        if given is not None:
            return _plain(_convert(kind, given, f"--{key.replace('_', '-')}", None))
        var = GATEWAY_ENV.get(key)
        if var is not None and env.get(var, "") != "":
            return _plain(_convert(kind, env[var], var, None))
        if key in table:
            return _plain(_convert(kind, table[key], f"{source}: [gateway] {key}", base))
        return default

    server = value("server", None)
    if not server:
        raise SettingsError(
            "--server is required (or env LLMGW_SERVER, or server in [gateway] of "
            "llmgw.toml): the control plane's URL"
        )
    token_file = value("token_file", None)
    if token_file is None:
        raise SettingsError(
            "--token-file is required (or env LLMGW_GATEWAY_TOKEN_FILE, or token_file in "
            "[gateway] of llmgw.toml): a gateway token (`llmgw token new NAME --role gateway`)"
        )
    try:
        token = Path(token_file).read_text(errors="replace").split()[0]
    except (OSError, IndexError):
        raise SettingsError(f"cannot read a token from {token_file}") from None
    defaults = GatewaySettings(server="", token="")
    usage_flush_s = value("usage_flush", defaults.usage_flush_s)
    if usage_flush_s > MAX_USAGE_FLUSH_S:
        raise SettingsError(
            f"usage_flush {usage_flush_s:g}s ([gateway] usage_flush): at most "
            f"{MAX_USAGE_FLUSH_S:g}s: what a killed gateway had not flushed is lost, at most "
            "this long of its traffic"
        )
    gateway_id = value("gateway_id", None)
    workers = max(value("workers", defaults.workers), 1)
    if workers > MAX_WORKERS:
        raise SettingsError(
            f"workers {workers} (--workers, LLMGW_GATEWAY_WORKERS or [gateway] workers): at "
            f"most {MAX_WORKERS} (the control plane counts a gateway "
            f"token as at most {MAX_WORKERS} workers in the autoscaler's signals); run "
            "another gateway with its own token for more"
        )
    return GatewaySettings(
        server=server[0],
        servers=server,
        token=token,
        host=value("host", defaults.host),
        port=value("port", defaults.port),
        gateway_id=gateway_id or defaults.gateway_id,
        max_body_bytes=int(value("max_body_mb", defaults.max_body_bytes / (1 << 20)) * (1 << 20)),
        attempts=max(value("attempts", defaults.attempts), 1),
        connect_timeout_s=value("connect_timeout", defaults.connect_timeout_s),
        read_timeout_s=value("read_timeout", defaults.read_timeout_s),
        max_answer_bytes=int(
            value("max_answer_mb", defaults.max_answer_bytes / (1 << 20)) * (1 << 20)
        ),
        max_answer_s=value("max_answer_time", defaults.max_answer_s),
        slow_start_s=value("slow_start", defaults.slow_start_s),
        max_wait_s=value("max_wait", defaults.max_wait_s),
        signals_interval_s=value("signals_interval", defaults.signals_interval_s),
        usage_flush_s=usage_flush_s,
        resync_s=value("resync", defaults.resync_s),
        tokenize_cache_s=value("tokenize_cache", defaults.tokenize_cache_s),
        admin_open=value("admin_open", defaults.admin_open),
        workers=workers,
        max_connections=value("max_connections", defaults.max_connections),
        queue_max_length=max(value("queue_max_length", defaults.queue_max_length), 1),
        queue_max_wait_s=value("queue_max_wait", defaults.queue_max_wait_s),
        queue_starvation_s=value("queue_starvation", defaults.queue_starvation_s),
        queue_hold_s=value("queue_hold", defaults.queue_hold_s),
        borrow=value("borrow", defaults.borrow),
        slot_share=None if (share := value("slot_share", None)) is None else min(share, 1.0),
        engine_secret=partial(_engine_secret, value("secrets_dir", None)),
    )


def _engine_secret(secrets_dir: Path | None, secret: str) -> str:
    # As an agent looks a profile's secret up (agent.secrets), the gateway's settings named.
    return read_secret(secret, secrets_dir, who="gateway")


def _plain(value: Any) -> Any:
    return value.total_seconds() if isinstance(value, timedelta) else value
