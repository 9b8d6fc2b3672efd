"""One settings file, ``llmgw.toml``, read by every command, the server, the daemon and
the agent (its ``[agent]`` table: ``llmgw.agent_settings``).

Each process used to apply its own staleness flags, so ``llmgw nodes list`` (90 s / 300 s
by default) could call a node stale while the server (started with 30 s / 20 s) called it
lost. Now every process resolves the same settings, in one place and one order:

    flags  >  environment  >  the settings file  >  defaults

The file is ``--settings PATH``, else ``LLMGW_SETTINGS``, else ``./llmgw.toml`` when
present. ``--config`` keeps its meaning (the declared catalog file): renaming it would
break every script and every other branch that passes it. Paths in the file are relative
to the file, so ``--settings /etc/llmgw/llmgw.toml`` means the same from any directory::

    [database]
    url = "sqlite:///llmgw.db"

    [catalog]
    file = "catalog.yaml"

    [policy]            # durations: 90s, 5m, 1h30m, or seconds
    stale_after = "90s"
    grace = "5m"
    interval = "10s"    # between the scheduler's rounds

    [scheduler]
    defragment = true   # move replicas (surge-first) to make room, repair spreads
    repair_spread = false  # true: repair every movable model's spread, not only opted-in ones
    leadership_lease = "20s"  # PostgreSQL: a frozen leader is replaced within this (+1 interval)

    [server]
    host = "127.0.0.1"
    port = 8080
    stream_poll = "500ms"
    catalog_max_age = "100ms"
    with_scheduler = false
    max_header_bytes = 65536   # a request's head; larger is answered 431
    max_headers = 100          # header lines; more is answered 431
    header_timeout = "10s"     # to send the request line and headers; then 408
    keep_alive_timeout = "5s"  # an idle connection is closed after this
    max_connections = 800      # open at once; then a new one takes an unserved one's place
    body_timeout = "120s"      # for a request's whole body, from its head; then 408
    body_min_rate = 1024       # bytes a second a body keeps up with after header_timeout
    heartbeat_port = 0         # agents' heartbeat connections (0: one the kernel picks)
    heartbeat_connections = 10000  # open at once; one more is answered BUSY
    # Where agents may say their engines answer, beside their own node's address.
    agent_endpoint_networks = ["10.0.0.0/8"]

    [auth]
    file = "auth.toml"  # the tokens (`llmgw token new --append-to auth.toml`)
    reads_open = false

    [autoscale]         # SLO autoscaling (autoscale.policy lists every key)
    enabled = true
    target = 0.7
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from autoscale.policy import DEFAULT_POLICY, Policy, PolicyError, parse_policy
from catalog.forms.durations import format_duration, parse_duration
from catalog.forms.servers import parse_servers
from events.database import DEFAULT_URL
from httpguard.limits import HeadLimits
from scheduler.daemon.lease_terms import lease_seconds
from scheduler.lifecycle.endpoints import EndpointPolicy, parse_networks
from scheduler.lifecycle.staleness import DEFAULT_STALENESS, StalenessPolicy

DEFAULT_CONFIG = Path("catalog.yaml")
DEFAULT_SETTINGS = Path("llmgw.toml")
# A settings file is a few hundred bytes; anything near this is not one.
MAX_SETTINGS_BYTES = 64 * 1024
TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off", ""})

# Every key the file may hold, by section, with what it is.
KEYS: dict[str, dict[str, str]] = {
    "database": {"url": "str"},
    "catalog": {"file": "path"},
    "policy": {
        "stale_after": "duration",
        "grace": "duration",
        "interval": "positive",
        "preemption": "bool",
    },
    # The placement scheduler's own switches (the round's policy, recorded with each round).
    "scheduler": {"defragment": "bool", "repair_spread": "bool", "leadership_lease": "positive"},
    "server": {
        "host": "str",
        "port": "port",
        "stream_poll": "positive",
        "catalog_max_age": "duration",
        "with_scheduler": "bool",
        "max_header_bytes": "count",
        "max_headers": "count",
        "header_timeout": "positive",
        "keep_alive_timeout": "positive",
        "max_connections": "count",
        "body_timeout": "positive",
        "body_min_rate": "count",
        "heartbeat_port": "port",
        "heartbeat_connections": "count",
        "agent_endpoint_networks": "networks",
    },
    "auth": {"file": "path", "reads_open": "bool"},
    # Checked by autoscale.policy.parse_policy (it has per-model tables of its own).
    "autoscale": {},
    # `llmgw agent` on a node (llmgw.agent_settings resolves these for it).
    "agent": {
        "server": "servers",
        "token_file": "path",
        "node": "str",
        "labels": "str",
        "fabric": "str",
        "interval": "positive",
        "full_report_every": "positive",
        "heartbeat_transport": "str",
        "state_dir": "path",
        "gpus": "str",
        "memory_gb": "number",
        "advertise": "str",
        "engine_host": "str",
        "stop_grace": "positive",
        "restart_backoff": "positive",
        "log_max_mb": "number",
        "log_keep": "count",
        "leave_engines": "bool",
        "secrets_dir": "path",
        "llamacpp_server": "str",
    },
    # `llmgw gateway` (llmgw.gateway_settings resolves these for it).
    "gateway": {
        "server": "servers",
        "token_file": "path",
        "host": "str",
        "port": "port",
        "gateway_id": "str",
        "max_body_mb": "number",
        "max_answer_mb": "number",
        "max_answer_time": "positive",
        "slow_start": "duration",
        "attempts": "count",
        "connect_timeout": "positive",
        "read_timeout": "positive",
        "max_wait": "duration",
        "signals_interval": "positive",
        "usage_flush": "positive",
        "resync": "positive",
        "tokenize_cache": "duration",
        "admin_open": "bool",
        "workers": "count",
        "max_connections": "count",
        "queue_max_length": "count",
        "queue_max_wait": "positive",
        "queue_starvation": "positive",
        "queue_hold": "duration",
        "slot_share": "number",
        "borrow": "bool",
        "secrets_dir": "path",
    },
}
# The environment variable for each setting (flags are named after the key).
ENV = {
    ("database", "url"): "LLMGW_DATABASE_URL",
    ("catalog", "file"): "LLMGW_CONFIG",
    ("policy", "stale_after"): "LLMGW_STALE_AFTER",
    ("policy", "grace"): "LLMGW_GRACE",
    ("policy", "interval"): "LLMGW_INTERVAL",
    ("policy", "preemption"): "LLMGW_PREEMPTION",
    ("scheduler", "defragment"): "LLMGW_DEFRAGMENT",
    ("scheduler", "repair_spread"): "LLMGW_REPAIR_SPREAD",
    ("scheduler", "leadership_lease"): "LLMGW_LEADERSHIP_LEASE",
    ("auth", "file"): "LLMGW_AUTH_FILE",
    ("auth", "reads_open"): "LLMGW_OPEN_READS",
}
# The command-line flag (argparse dest) for each setting.
FLAGS = {
    ("database", "url"): "db",
    ("catalog", "file"): "config",
    ("policy", "stale_after"): "stale_after",
    ("policy", "grace"): "grace",
    ("policy", "interval"): "interval",
    ("policy", "preemption"): "preemption",
    ("scheduler", "defragment"): "defragment",
    ("scheduler", "repair_spread"): "repair_spread",
    ("scheduler", "leadership_lease"): "leadership_lease",
    ("server", "host"): "host",
    ("server", "port"): "port",
    ("server", "stream_poll"): "stream_poll",
    ("server", "catalog_max_age"): "catalog_max_age",
    ("server", "with_scheduler"): "with_scheduler",
    ("auth", "file"): "auth_file",
    ("auth", "reads_open"): "open_reads",
}


# A snapshot key shorter than this is a placeholder, not a secret.
MIN_SNAPSHOT_KEY = 16


class SettingsError(ValueError):
    """The settings cannot be used; the message names the file or variable and the key."""


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    stream_poll_s: float = 0.5
    catalog_max_age_s: float = 0.1
    with_scheduler: bool = False
    limits: HeadLimits = field(default_factory=HeadLimits)
    endpoints: EndpointPolicy = field(default_factory=EndpointPolicy)
    # Agents' heartbeats (llmgw.api.reports.heartbeat_listener): their own listener, on
    # ``host``, with a connection cap of its own (the API's is for requests).
    heartbeat_port: int = 0
    heartbeat_connections: int = 10_000


@dataclass(frozen=True, slots=True)
class Settings:
    database_url: str
    # None: no declared models (no file given and no ./catalog.yaml).
    config_path: Path | None
    policy: StalenessPolicy = DEFAULT_STALENESS
    interval_s: float = 10.0
    # [scheduler] leadership_lease; None: twice the interval, at least 2 s (lease_s).
    leadership_lease_s: float | None = None
    server: ServerSettings = field(default_factory=ServerSettings)
    auth_file: Path | None = None
    # None: not set here; the auth file's `reads_open` then decides (else closed).
    reads_open: bool | None = None
    # The settings file read, if any (shown by `llmgw settings`).
    source: Path | None = None
    # [autoscale] (autoscale.policy), from the file only.
    autoscale: Policy = DEFAULT_POLICY
    # LLMGW_SNAPSHOT_KEY, held outside the database: snapshots are MACed with it, and one
    # that does not match is refused at start-up (events.read.snapshots). From the environment
    # only, as a secret should be: never from the settings file, never shown.
    snapshot_key_text: str | None = field(default=None, repr=False)
    # Where each value in force came from, by section and key (``llmgw settings`` shows
    # it beside the value): "flag --db", "env LLMGW_GRACE", "file" or "default". A
    # value that surprises an operator is usually one set somewhere they did not look.
    origins: Mapping[str, Mapping[str, str]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def lease_s(self) -> float:
        """The scheduler's leadership lease (``scheduler.daemon.lease_terms``)."""
        return lease_seconds(self.interval_s, self.leadership_lease_s)

    @property
    def snapshot_key(self) -> bytes | None:
        text = self.snapshot_key_text
        if not text:
            return None
        if len(text) < MIN_SNAPSHOT_KEY:
            raise SettingsError(
                f"LLMGW_SNAPSHOT_KEY is {len(text)} characters: a snapshot key needs at least "
                f"{MIN_SNAPSHOT_KEY} (e.g. the output of `openssl rand -hex 32`), or unset it"
            )
        return text.encode("utf-8")

    @classmethod
    def resolve(
        cls,
        db: str | None = None,
        config: str | None = None,
        *,
        settings_file: str | None = None,
        flags: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Settings:
        """Flags (``flags``, by argparse dest; ``db`` and ``config`` as before), then the
        environment, then the settings file, then the defaults."""
        env = os.environ if env is None else env
        cwd = Path.cwd() if cwd is None else cwd
        given = {k: v for k, v in (flags or {}).items() if v is not None}
        if db:
            given["db"] = db
        if config:
            given["config"] = config
        source = _settings_path(settings_file, env, cwd)
        data = _read(source) if source is not None else {}
        base = source.parent if source is not None else cwd

        def pick(section: str, key: str) -> tuple[Any, str, bool] | None:
            """The value, where it came from, and whether from the file; None: the default."""
            dest = FLAGS.get((section, key))
            if dest is not None and dest in given:
                return given[dest], f"--{dest.replace('_', '-')}", False
            var = ENV.get((section, key))
            if var is not None and env.get(var, "") != "":
                return env[var], var, False
            if key in data.get(section, {}):
                return data[section][key], f"{source}: [{section}] {key}", True
            return None

        origins: dict[str, dict[str, str]] = {}

        def value(section: str, key: str, default: Any) -> Any:
            found = pick(section, key)
            shown = origins.setdefault(section, {})
            if found is None:
                shown[key] = DEFAULT_ORIGIN
                return default
            raw, origin, in_file = found
            shown[key] = FILE_ORIGIN if in_file else origin_of(origin)
            return _convert(KEYS[section][key], raw, origin, base if in_file else None)

        url = value("database", "url", None)
        if url is None:
            url = DEFAULT_URL
        url_from = pick("database", "url")
        if url_from is not None and url_from[2]:
            url = _relative_sqlite(url, base)
        config_path = value("catalog", "file", None)
        if config_path is None and (cwd / DEFAULT_CONFIG).exists():
            config_path = DEFAULT_CONFIG
        try:
            policy = StalenessPolicy(
                stale_after=value("policy", "stale_after", DEFAULT_STALENESS.stale_after),
                grace=value("policy", "grace", DEFAULT_STALENESS.grace),
                preemption=value("policy", "preemption", DEFAULT_STALENESS.preemption),
                defragment=value("scheduler", "defragment", DEFAULT_STALENESS.defragment),
                repair_spread=value("scheduler", "repair_spread", DEFAULT_STALENESS.repair_spread),
            )
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        interval = value("policy", "interval", timedelta(seconds=10)).total_seconds()
        lease = value("scheduler", "leadership_lease", None)
        defaults = ServerSettings()
        server = ServerSettings(
            host=value("server", "host", defaults.host),
            port=value("server", "port", defaults.port),
            stream_poll_s=value(
                "server", "stream_poll", timedelta(seconds=defaults.stream_poll_s)
            ).total_seconds(),
            catalog_max_age_s=value(
                "server", "catalog_max_age", timedelta(seconds=defaults.catalog_max_age_s)
            ).total_seconds(),
            with_scheduler=value("server", "with_scheduler", defaults.with_scheduler),
            limits=_limits(value, defaults.limits),
            endpoints=EndpointPolicy(
                networks=value("server", "agent_endpoint_networks", defaults.endpoints.networks)
            ),
            heartbeat_port=value("server", "heartbeat_port", defaults.heartbeat_port),
            heartbeat_connections=value(
                "server", "heartbeat_connections", defaults.heartbeat_connections
            ),
        )
        try:
            autoscale = parse_policy(data.get("autoscale", {}), f"{source}: [autoscale]")
        except PolicyError as exc:
            raise SettingsError(str(exc)) from None
        origins["autoscale"] = {
            key: FILE_ORIGIN if key in data.get("autoscale", {}) else DEFAULT_ORIGIN
            for key in autoscale.to_json()
        }
        return cls(
            autoscale=autoscale,
            database_url=normalise_url(url),
            config_path=config_path,
            policy=policy,
            interval_s=interval,
            leadership_lease_s=None if lease is None else lease.total_seconds(),
            server=server,
            auth_file=value("auth", "file", None),
            reads_open=value("auth", "reads_open", None),
            source=source,
            snapshot_key_text=env.get("LLMGW_SNAPSHOT_KEY") or None,
            origins=origins,
        )

    def to_json(self) -> dict[str, Any]:
        """The settings in force, in the file's shape (``llmgw settings``)."""
        return {
            "settings_file": None if self.source is None else str(self.source),
            "database": {"url": self.database_url},
            "catalog": {"file": None if self.config_path is None else str(self.config_path)},
            "policy": {
                "stale_after": format_duration(self.policy.stale_after),
                "grace": format_duration(self.policy.grace),
                "interval": format_duration(timedelta(seconds=self.interval_s)),
                "preemption": self.policy.preemption,
            },
            "scheduler": {
                "defragment": self.policy.defragment,
                "repair_spread": self.policy.repair_spread,
                "leadership_lease": _seconds(self.lease_s),
            },
            "server": {
                "host": self.server.host,
                "port": self.server.port,
                "stream_poll": format_duration(timedelta(seconds=self.server.stream_poll_s)),
                "catalog_max_age": format_duration(
                    timedelta(seconds=self.server.catalog_max_age_s)
                ),
                "with_scheduler": self.server.with_scheduler,
                "max_header_bytes": self.server.limits.max_header_bytes,
                "max_headers": self.server.limits.max_headers,
                "header_timeout": _seconds(self.server.limits.header_timeout_s),
                "keep_alive_timeout": _seconds(self.server.limits.keep_alive_timeout_s),
                "max_connections": self.server.limits.max_connections,
                "body_timeout": _seconds(self.server.limits.body_timeout_s),
                "body_min_rate": self.server.limits.body_min_rate,
                "heartbeat_port": self.server.heartbeat_port,
                "heartbeat_connections": self.server.heartbeat_connections,
                "agent_endpoint_networks": [str(n) for n in self.server.endpoints.networks],
            },
            "auth": {
                "file": None if self.auth_file is None else str(self.auth_file),
                "reads_open": self.reads_open,
            },
            "autoscale": self.autoscale.to_json(),
        }


DEFAULT_ORIGIN = "default"
FILE_ORIGIN = "file"


def _seconds(value: float) -> str:
    return format_duration(timedelta(seconds=value))


def _limits(value: Any, defaults: HeadLimits) -> HeadLimits:
    """The request limits of ``[server]`` (httpguard); a refusal names the key."""
    counts = {}
    for key in ("max_header_bytes", "max_headers", "max_connections", "body_min_rate"):
        counts[key] = value("server", key, getattr(defaults, key))
        if counts[key] < 1:
            raise SettingsError(f"[server] {key} must be at least 1, not {counts[key]}")
    return HeadLimits(
        header_timeout_s=value(
            "server", "header_timeout", timedelta(seconds=defaults.header_timeout_s)
        ).total_seconds(),
        keep_alive_timeout_s=value(
            "server", "keep_alive_timeout", timedelta(seconds=defaults.keep_alive_timeout_s)
        ).total_seconds(),
        body_timeout_s=value(
            "server", "body_timeout", timedelta(seconds=defaults.body_timeout_s)
        ).total_seconds(),
        **counts,
    )


def origin_of(where: str) -> str:
    """``--db`` -> ``flag --db``; ``LLMGW_GRACE`` -> ``env LLMGW_GRACE`` (how a refusal
    names a value's source, shortened for ``llmgw settings``)."""
    return f"flag {where}" if where.startswith("--") else f"env {where}"


def _settings_path(given: str | None, env: Mapping[str, str], cwd: Path) -> Path | None:
    if given:
        return Path(given)
    if env.get("LLMGW_SETTINGS"):
        return Path(env["LLMGW_SETTINGS"])
    found = cwd / DEFAULT_SETTINGS
    return found if found.is_file() else None


def _read(path: Path) -> dict[str, dict[str, Any]]:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_SETTINGS_BYTES + 1)
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read the settings file: {exc.strerror}") from None
    if len(raw) > MAX_SETTINGS_BYTES:
        raise SettingsError(f"{path}: larger than {MAX_SETTINGS_BYTES} bytes; not a settings file")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{path}: not valid TOML: {exc}") from None
    problems: list[str] = []
    for section, table in data.items():
        if section not in KEYS:
            problems.append(f"unknown section [{section}] (known: {', '.join(KEYS)})")
        elif not isinstance(table, dict):
            problems.append(f"{section} must be a [{section}] table")
        elif section != "autoscale":
            problems.extend(
                f"unknown key {key!r} in [{section}] (known: {', '.join(KEYS[section])})"
                for key in table
                if key not in KEYS[section]
            )
    if problems:
        raise SettingsError(f"{path}: " + "; ".join(problems))
    return data


def _convert(kind: str, raw: Any, origin: str, base: Path | None) -> Any:
    """One setting as its type; a refusal names where the value came from."""
    try:
        if kind == "duration":
            return parse_duration(raw)
        if kind == "positive":
            duration = parse_duration(raw)
            if duration <= timedelta(0):
                raise ValueError(f"{raw!r} must be a positive duration")
            return duration
        if kind == "bool":
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.lower() in TRUE | FALSE:
                return raw.lower() in TRUE
            raise ValueError(f"{raw!r} is not true or false")
        if kind == "number":
            if isinstance(raw, bool) or not isinstance(raw, int | float | str):
                raise ValueError(f"{raw!r} is not a number")
            number = float(raw)
            if not number > 0 or number == float("inf"):
                raise ValueError(f"{raw!r} must be a positive number")
            return number
        if kind == "count":
            if isinstance(raw, bool) or not isinstance(raw, int | str):
                raise ValueError(f"{raw!r} is not a whole number")
            count = int(raw)
            if count < 0:
                raise ValueError(f"{count} must be 0 or more")
            return count
        if kind == "networks":
            return parse_networks(raw)
        if kind == "servers":
            return parse_servers(raw)
        if kind == "port":
            if isinstance(raw, bool) or not isinstance(raw, int | str):
                raise ValueError(f"{raw!r} is not a port number")
            port = int(raw)
            if not 0 <= port <= 65535:
                raise ValueError(f"port {port} is not a port number (0-65535)")
            return port
        if kind == "path":
            if not isinstance(raw, str | Path) or not str(raw):
                raise ValueError(f"{raw!r} is not a file path")
            path = Path(raw)
            return path if path.is_absolute() or base is None else base / path
        if not isinstance(raw, str) or not raw or len(raw) > 4096:
            raise ValueError(f"{str(raw)[:60]!r} is not a non-empty string")
        return raw
    except ValueError as exc:
        raise SettingsError(f"{origin}: {exc}") from None


def _relative_sqlite(url: str, base: Path) -> str:
    """``sqlite:///llmgw.db`` in a settings file is next to the file, as its other paths are."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return url
    rest = url[len(prefix) :]
    if not rest or rest.startswith(("/", ":memory:")):
        return url
    return prefix + str(base / rest)


def normalise_url(url: str) -> str:
    """``postgres://`` and ``postgresql://`` (as libpq and most hosting write them) use the
    psycopg 3 driver this release installs; SQLAlchemy alone would look for psycopg2."""
    for scheme in ("postgres://", "postgresql://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme) :]
    return url
