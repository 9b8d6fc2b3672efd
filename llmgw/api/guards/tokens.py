"""Bearer tokens: who may call the API, in which role, stored hashed.

A token is 32 random bytes (256 bits) from ``secrets``, shown once when it is
issued (``llmgw token new``). Only its SHA-256 is configured. A plain, fast
hash is enough *because* the token is random: there is nothing to guess a
256-bit value from, so the slow, salted hashes that protect people's
passwords (bcrypt, argon2) would add ~100 ms to every request and no
security. A leaked settings file therefore leaks no usable token.

A presented token is hashed and its digest looked up among the configured
ones; the time that takes depends only on the digest, which reveals nothing
about any configured token (see ``TokenBook.verify``).

Roles:

- ``operator``: changes the catalog; may also report any node (tooling).
- ``agent``: reports only the nodes it was issued for; reads.
- ``reader``: reads.
- ``gateway``: an ``llmgw gateway``: reads the catalog, the placements, the client
  tokens' hashes (``GET /v1/gateway/client-tokens``) and the operator and reader tokens'
  (``GET /v1/gateway/reader-tokens``, for its own ``/metrics`` and ``/routing``), posts
  signal windows; nothing else.
- ``client``: an application calling a gateway (``/v1/chat/completions``...), optionally
  limited to some models (``models``). The control plane answers it nothing: the gateway
  verifies it, from the hashes it reads.

The token's name is recorded as the ``actor`` of every event it causes.
"""

from __future__ import annotations

import enum
import hashlib
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from catalog.definition.identifiers import MODEL_NAME, NODE_NAME
from catalog.forms.client_limits import NO_LIMITS, ClientLimits
from catalog.forms.priority import MAX_SHARE, PRIORITY_CLASSES

TOKEN_PREFIX = "llmgw_"
# What a gateway token may read (path prefixes): the catalog, the placements, the event
# stream that announces changes to both, and the client tokens' hashes.
GATEWAY_READS = (
    "/v1/catalog",
    "/v1/models",
    "/v1/placements",
    "/v1/events",
    "/v1/gateway/",
)
# A token name is an event's actor and a key in the settings file: keep it to
# characters that need no quoting anywhere (and no ':' ';' ',' used by LLMGW_TOKENS).
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


class Role(enum.StrEnum):
    OPERATOR = "operator"
    AGENT = "agent"
    READER = "reader"
    GATEWAY = "gateway"
    CLIENT = "client"


# Who may post gateways' signal windows. "gateway" takes effect once Role has it.
SIGNAL_ROLES = frozenset({"operator", "gateway"})


class TokenConfigError(ValueError):
    """A token entry that cannot be used; the message names the entry and the fix."""


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One configured token: its name, role, the nodes an agent may report, and its hash."""

    name: str
    role: Role
    sha256: str
    nodes: tuple[str, ...] = ()
    # A client token's models (names or aliases); empty: every model.
    models: tuple[str, ...] = ()
    # A client token's limits (only the database's tokens have any: `llmgw token limits`).
    limits: ClientLimits = NO_LIMITS
    # A client token's place in a full model's queue at the gateway: its class (higher
    # goes first) and its share of the model within the class (gateway.stages.queue).
    priority_class: str = "standard"
    share: int = 1

    @classmethod
    def of(cls, data: dict[str, Any], where: str) -> TokenEntry:
        """An entry from the settings file (a TOML table), checked; ``where`` names it."""
        known = {"name", "role", "sha256", "nodes", "models"}
        extra = sorted(set(data) - known)
        if extra:
            raise TokenConfigError(
                f"{where}: unknown key(s) {', '.join(map(repr, extra))}; "
                f"a token has {', '.join(sorted(known))}"
            )
        name, role, digest, nodes = (data.get(k) for k in ("name", "role", "sha256", "nodes"))
        if not isinstance(nodes, list | tuple | type(None)) or not all(
            isinstance(n, str) for n in nodes or ()
        ):
            raise TokenConfigError(f"{where}: nodes must be a list of node names")
        models = data.get("models")
        if not isinstance(models, list | tuple | type(None)) or not all(
            isinstance(m, str) for m in models or ()
        ):
            raise TokenConfigError(f"{where}: models must be a list of model names")
        return cls.checked(
            name, role, digest, tuple(nodes or ()), where, models=tuple(models or ())
        )

    @classmethod
    def checked(
        cls,
        name: object,
        role: object,
        digest: object,
        nodes: tuple[str, ...],
        where: str,
        *,
        models: tuple[str, ...] = (),
        limits: ClientLimits = NO_LIMITS,
        priority_class: str = "standard",
        share: int = 1,
    ) -> TokenEntry:
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise TokenConfigError(
                f"{where}: name {name!r} must be 1-64 letters, digits or ._@- "
                "(it becomes the actor of the events the token causes)"
            )
        try:
            parsed_role = Role(str(role))
        except ValueError:
            raise TokenConfigError(
                f"{where}: token {name!r} has role {role!r}; use one of "
                f"{', '.join(r.value for r in Role)}"
            ) from None
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise TokenConfigError(
                f"{where}: token {name!r}: sha256 must be the 64 lowercase hex digits "
                "printed by `llmgw token new` (the token itself is never configured)"
            )
        if parsed_role is Role.AGENT and not nodes:
            raise TokenConfigError(
                f"{where}: agent token {name!r} names no node; give the nodes it may report"
            )
        if parsed_role is not Role.AGENT and nodes:
            raise TokenConfigError(
                f"{where}: token {name!r} has the {parsed_role.value} role and cannot be "
                "limited to nodes; only agent tokens are"
            )
        if any(not n for n in nodes):
            raise TokenConfigError(f"{where}: token {name!r} names an empty node")
        for node in nodes:
            problem = NODE_NAME.problem(node)
            if problem is not None:
                raise TokenConfigError(f"{where}: token {name!r}: node {node!r} {problem}")
        if models and parsed_role is not Role.CLIENT:
            raise TokenConfigError(
                f"{where}: token {name!r} has the {parsed_role.value} role and cannot be "
                "limited to models; only client tokens are"
            )
        for model in models:
            problem = MODEL_NAME.problem(model)
            if problem is not None:
                raise TokenConfigError(f"{where}: token {name!r}: model {model!r} {problem}")
        if priority_class not in PRIORITY_CLASSES:
            raise TokenConfigError(
                f"{where}: token {name!r}: priority class {str(priority_class)[:20]!r} is not "
                f"one of {', '.join(PRIORITY_CLASSES)}"
            )
        if type(share) is not int or not 1 <= share <= MAX_SHARE:
            raise TokenConfigError(
                f"{where}: token {name!r}: share {share!r} must be a whole number from 1 to "
                f"{MAX_SHARE} (a client's part of a full model, against the others' shares)"
            )
        if (priority_class != "standard" or share != 1) and parsed_role is not Role.CLIENT:
            raise TokenConfigError(
                f"{where}: token {name!r} has the {parsed_role.value} role and cannot have a "
                "priority class or share; only client tokens call the gateway"
            )
        if not limits.empty and parsed_role is not Role.CLIENT:
            raise TokenConfigError(
                f"{where}: token {name!r} has the {parsed_role.value} role and cannot have "
                "limits (--rpm, --tpm, --max-inflight, --budget); only client tokens do"
            )
        return cls(name, parsed_role, digest, nodes, models, limits, priority_class, share)

    def to_toml(self) -> str:
        lines = ["[[tokens]]", f'name = "{self.name}"', f'role = "{self.role.value}"']
        if self.nodes:
            lines.append("nodes = [" + ", ".join(_toml_string(n) for n in self.nodes) + "]")
        if self.models:
            lines.append("models = [" + ", ".join(_toml_string(m) for m in self.models) + "]")
        lines.append(f'sha256 = "{self.sha256}"')
        return "\n".join(lines)

    def to_env(self) -> str:
        """The entry in ``LLMGW_TOKENS`` form: ``name:role:sha256[:node,node]`` (for a
        client token the fourth part lists its models)."""
        parts = [self.name, self.role.value, self.sha256]
        if self.nodes or self.models:
            parts.append(",".join(self.nodes or self.models))
        return ":".join(parts)


def _toml_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def parse_env_tokens(value: str, where: str = "LLMGW_TOKENS") -> list[TokenEntry]:
    """``name:role:sha256[:node,node]`` entries separated by ``;`` or new lines."""
    entries = []
    for i, raw in enumerate(re.split(r"[;\n]", value)):
        text = raw.strip()
        if not text:
            continue
        parts = text.split(":")
        if len(parts) not in (3, 4):
            raise TokenConfigError(
                f"{where} entry {i + 1}: expected name:role:sha256 or name:role:sha256:node,node"
            )
        listed = tuple(n.strip() for n in parts[3].split(",")) if len(parts) == 4 else ()
        # The fourth part is an agent's nodes, or a client's models.
        client = parts[1] == Role.CLIENT.value
        nodes, models = ((), listed) if client else (listed, ())
        entries.append(
            TokenEntry.checked(
                parts[0], parts[1], parts[2], nodes, f"{where} entry {i + 1}", models=models
            )
        )
    return entries


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the token's name (the events' actor), role and nodes."""

    name: str
    role: Role
    nodes: frozenset[str] = frozenset()

    def may_change_catalog(self) -> bool:
        return self.role is Role.OPERATOR

    def may_read(self, path: str) -> bool:
        """A gateway reads only what it routes by; a client token reads nothing here."""
        if self.role is Role.CLIENT:
            return False
        return self.role is not Role.GATEWAY or path.startswith(GATEWAY_READS)

    def may_report_signals(self) -> bool:
        """A gateway's load windows (``POST /v1/signals``): by role name, so the gateway
        role needs no change here when it is added to ``Role``."""
        return self.role.value in SIGNAL_ROLES

    def may_report(self, node: str) -> bool:
        return self.role is Role.OPERATOR or (self.role is Role.AGENT and node in self.nodes)


class TokenBook:
    """The configured tokens; answers "whose is this token?"."""

    def __init__(self, entries: Iterable[TokenEntry]) -> None:
        self._entries = tuple(entries)
        seen: dict[str, str] = {}
        for e in self._entries:
            if e.sha256 in seen:
                raise TokenConfigError(
                    f"tokens {seen[e.sha256]!r} and {e.name!r} have the same hash; "
                    "issue a new token for one of them"
                )
            seen[e.sha256] = e.name
        # One Principal per token, made once: every request of an agent gets the same.
        self._principals = {
            e.sha256: Principal(e.name, e.role, frozenset(e.nodes)) for e in self._entries
        }

    def __len__(self) -> int:
        return len(self._entries)

    def clients(self) -> list[TokenEntry]:
        """The client tokens (their hashes), for the gateways to verify them by."""
        return [e for e in self._entries if e.role is Role.CLIENT]

    def readers(self) -> list[TokenEntry]:
        """The operator and reader tokens (their hashes): what a gateway lets read its
        ``/metrics`` and ``/routing``, as this server lets them read its own."""
        return [e for e in self._entries if e.role in (Role.OPERATOR, Role.READER)]

    def verify(self, token: str) -> Principal | None:
        # Looked up by the presented token's SHA-256, not compared with every entry: a
        # request costs the same with 10,000 agent tokens as with one. The lookup's
        # time can depend on the digest only, and a digest says nothing an attacker
        # can use (finding a token whose digest shares a prefix with a configured one
        # is of no help in finding that token).
        return self._principals.get(digest(token))


@dataclass(frozen=True, slots=True)
class IssuedToken:
    token: str
    entry: TokenEntry


def issue_token(
    name: str,
    role: str,
    nodes: Iterable[str] = (),
    models: Iterable[str] = (),
    limits: ClientLimits = NO_LIMITS,
    *,
    priority_class: str = "standard",
    share: int = 1,
) -> IssuedToken:
    """A fresh random token and the entry (holding only its hash) to configure."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    entry = TokenEntry.checked(
        name,
        role,
        digest(token),
        tuple(nodes),
        "llmgw token new",
        models=tuple(models),
        limits=limits,
        priority_class=priority_class,
        share=share,
    )
    return IssuedToken(token, entry)
