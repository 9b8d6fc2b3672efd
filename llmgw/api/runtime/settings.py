"""What ``llmgw serve`` is configured with: tokens, open reads, stream and staleness timings.

Tokens come from a TOML settings file (``--auth-file`` or ``LLMGW_AUTH_FILE``)
and from ``LLMGW_TOKENS``; both are read, so a deployment can keep agents in
the file and add a break-glass operator through its secret store. The file::

    # Reads without a token (GET routes, /metrics); writes always need one.
    reads_open = false

    [[tokens]]
    name = "alice"
    role = "operator"
    sha256 = "9f86d0..."        # printed by `llmgw token new`; never the token

    [[tokens]]
    name = "agent-gpu-7"
    role = "agent"
    nodes = ["gpu-7"]
    sha256 = "..."
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autoscale.policy import DEFAULT_POLICY, Policy
from llmgw.api.guards.tokens import TokenBook, TokenConfigError, TokenEntry, parse_env_tokens
from llmgw.api.reports.heartbeat_listener import MAX_CONNECTIONS
from llmgw.settings import SettingsError
from scheduler.lifecycle.endpoints import NO_NETWORKS, EndpointPolicy
from scheduler.lifecycle.staleness import DEFAULT_STALENESS, StalenessPolicy

__all__ = ["ApiSettings", "SettingsError"]

TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True, slots=True)
class ApiSettings:
    tokens: tuple[TokenEntry, ...] = ()
    # Reads may be open (a cluster's model list is rarely a secret); writes never are.
    reads_open: bool = False
    # How often an idle event stream looks for new events, and sends a keep-alive.
    stream_poll_s: float = 0.5
    keepalive_s: float = 15.0
    # How old the catalog a read is answered from may be (see events.read.model).
    catalog_max_age_s: float = 0.1
    # A model definition or node report is a few kilobytes; a megabyte is a mistake.
    max_body_bytes: int = 1 << 20
    policy: StalenessPolicy = field(default_factory=lambda: DEFAULT_STALENESS)
    # The networks agents may report endpoints in beside their node's own address.
    endpoints: EndpointPolicy = NO_NETWORKS
    # [autoscale]: what /v1/autoscale shows as the policy in force.
    autoscale: Policy = DEFAULT_POLICY
    # Where agents' heartbeats are heard (llmgw.api.reports.heartbeat_listener): None, no
    # listener (agents send full reports only); port 0, one the kernel picks.
    heartbeat_host: str | None = None
    heartbeat_port: int = 0
    heartbeat_connections: int = MAX_CONNECTIONS

    def book(self) -> TokenBook:
        return TokenBook(self.tokens)

    @classmethod
    def load(
        cls,
        auth_file: Path | None = None,
        *,
        env: Mapping[str, str] | None = None,
        reads_open: bool | None = None,
        stream_poll_s: float = 0.5,
        catalog_max_age_s: float = 0.1,
        policy: StalenessPolicy = DEFAULT_STALENESS,
        endpoints: EndpointPolicy = NO_NETWORKS,
        autoscale: Policy = DEFAULT_POLICY,
        heartbeat_host: str | None = None,
        heartbeat_port: int = 0,
        heartbeat_connections: int = MAX_CONNECTIONS,
    ) -> ApiSettings:
        """Tokens from ``auth_file`` (else ``LLMGW_AUTH_FILE``) and ``LLMGW_TOKENS``.

        ``reads_open`` given wins; else the file's ``reads_open``, else
        ``LLMGW_OPEN_READS``.
        """
        env = os.environ if env is None else env
        path = auth_file or (Path(env["LLMGW_AUTH_FILE"]) if env.get("LLMGW_AUTH_FILE") else None)
        tokens: list[TokenEntry] = []
        file_open: bool | None = None
        try:
            if path is not None:
                file_tokens, file_open = _read_file(path)
                tokens.extend(file_tokens)
            if env.get("LLMGW_TOKENS"):
                tokens.extend(parse_env_tokens(env["LLMGW_TOKENS"]))
            settings = cls(
                tokens=tuple(tokens),
                reads_open=(
                    reads_open
                    if reads_open is not None
                    else file_open
                    if file_open is not None
                    else env.get("LLMGW_OPEN_READS", "").lower() in TRUE
                ),
                stream_poll_s=stream_poll_s,
                catalog_max_age_s=catalog_max_age_s,
                policy=policy,
                endpoints=endpoints,
                autoscale=autoscale,
                heartbeat_host=heartbeat_host,
                heartbeat_port=heartbeat_port,
                heartbeat_connections=heartbeat_connections,
            )
            settings.book()  # refuses two entries with one hash now, not at the first request
        except TokenConfigError as exc:
            raise SettingsError(str(exc)) from None
        return settings


def _read_file(path: Path) -> tuple[list[TokenEntry], bool | None]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read the auth file: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: not valid TOML: {exc}") from None
    extra = sorted(set(data) - {"tokens", "reads_open"})
    if extra:
        raise SettingsError(
            f"{path}: unknown key(s) {', '.join(map(repr, extra))}; the file holds "
            "`reads_open` and `[[tokens]]` tables"
        )
    reads_open = data.get("reads_open")
    if reads_open is not None and not isinstance(reads_open, bool):
        raise SettingsError(f"{path}: reads_open must be true or false")
    raw = data.get("tokens", [])
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise SettingsError(f"{path}: tokens must be [[tokens]] tables")
    return [TokenEntry.of(t, f"{path} tokens[{i}]") for i, t in enumerate(raw)], reads_open
