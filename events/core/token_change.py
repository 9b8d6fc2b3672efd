"""A token's issue, revocation or change of limits, as the events ``token.issued``,
``token.revoked`` and ``token.limits_changed`` hold it.

Pure. The token table (events.database.tables.TokenRow) is what the servers check a
bearer token against; these events are its audit trail, appended in the same
transaction as the row's change, so that `llmgw history` says who issued or revoked
which token and when, and `llmgw verify` covers that record with the hash chain. The
payload names the token and its scope; it never holds the token (nobody has it after
`token new` printed it) nor its hash (readers of the log must not get a value to try
tokens against offline, however hopeless: 256 random bits).

``check_token_change`` is replay's reading of such an event: any other shape is
unreadable, skipped and named like every bad row; a good one changes nothing in the
catalog.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from catalog.forms.client_limits import NO_LIMITS, ClientLimits, LimitError, from_json
from catalog.forms.priority import MAX_SHARE, PRIORITY_CLASSES
from events.core.types import (
    CURRENT_SCHEMA,
    TOKEN_ISSUED,
    TOKEN_LIMITS_CHANGED,
    TOKEN_REVOKED,
    NewEvent,
)
from events.core.upcast import UnreadableEvent

# What replay reads of such an event: a name is the actor of the token's events
# (llmgw.api.guards.tokens.NAME_PATTERN), a scope at most this many names.
MAX_SCOPE = 10_000
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_ROLE = re.compile(r"[a-z]{1,32}")
VIA = frozenset({"new", "import"})


@dataclass(frozen=True, slots=True)
class TokenChange:
    """One token issued (``revoked`` False), revoked, or its limits changed (``before``
    not None: from ``before`` to ``limits``), without its secret or hash."""

    name: str
    role: str
    revoked: bool = False
    nodes: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    # How an issued token came: "new" (`llmgw token new`) or "import" (from an auth file).
    via: str = "new"
    # A client token's limits (as issued, or after a change).
    limits: ClientLimits = NO_LIMITS
    # The limits before a change (``token.limits_changed``); None for an issue or revocation.
    before: ClientLimits | None = None
    # A client token's place in a full model's queue; in the payload only when not the
    # defaults, so every event written before reads as it did.
    priority_class: str = "standard"
    share: int = 1

    @property
    def type(self) -> str:
        if self.before is not None:
            return TOKEN_LIMITS_CHANGED
        return TOKEN_REVOKED if self.revoked else TOKEN_ISSUED

    def describe(self) -> str:
        """One line for people: which token, its role and scope."""
        scope = ""
        if self.nodes:
            scope = f", nodes {','.join(self.nodes)}"
        elif self.models:
            scope = f", models {','.join(self.models)}"
        if self.priority_class != "standard" or self.share != 1:
            scope += f", class {self.priority_class}, share {self.share}"
        if self.revoked:
            return f"token {self.name} ({self.role}) revoked"
        if self.before is not None:
            return (
                f"token {self.name} ({self.role}) limits changed: "
                f"{self.before.describe()} -> {self.limits.describe()}"
            )
        if not self.limits.empty:
            scope += f", limits {self.limits.describe()}"
        how = " (imported from an auth file)" if self.via == "import" else ""
        return f"token {self.name} ({self.role}{scope}) issued{how}"

    def payload(self) -> dict[str, Any]:
        if self.revoked:
            return {"name": self.name, "role": self.role}
        if self.before is not None:
            return {
                "name": self.name,
                "role": self.role,
                "before": self.before.to_json(),
                "after": self.limits.to_json(),
            }
        out: dict[str, Any] = {
            "name": self.name,
            "role": self.role,
            "nodes": list(self.nodes),
            "models": list(self.models),
            "via": self.via,
        }
        if self.priority_class != "standard" or self.share != 1:
            out["priority_class"] = self.priority_class
            out["share"] = self.share
        if not self.limits.empty:
            out["limits"] = self.limits.to_json()
        return out


def event_for(change: TokenChange) -> NewEvent:
    # ``model`` stays empty: the event is about no model, and `history --model` must not
    # list it under a model that happens to share the token's name.
    return NewEvent(
        type=change.type,
        model="",
        payload=json.dumps(change.payload(), separators=(",", ":")),
        schema_version=CURRENT_SCHEMA[change.type],
    )


def check_token_change(event_type: str, payload: dict[str, Any]) -> TokenChange:
    """Replay's reading of the event's (upcast) payload; anything else is unreadable."""
    name, role = payload.get("name"), payload.get("role")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UnreadableEvent("payload name is not a token name")
    if not isinstance(role, str) or not _ROLE.fullmatch(role):
        raise UnreadableEvent(f"payload role of token {name!r} is not a role")
    if event_type == TOKEN_REVOKED:
        return TokenChange(name, role, revoked=True)
    if event_type == TOKEN_LIMITS_CHANGED:
        before = _limits(payload.get("before"), name, "before")
        return TokenChange(
            name, role, limits=_limits(payload.get("after"), name, "after"), before=before
        )
    scope: dict[str, tuple[str, ...]] = {}
    for key in ("nodes", "models"):
        value = payload.get(key, [])
        if (
            not isinstance(value, list)
            or len(value) > MAX_SCOPE
            or not all(isinstance(v, str) for v in value)
        ):
            raise UnreadableEvent(f"payload {key} of token {name!r} is not a list of names")
        scope[key] = tuple(value)
    via = payload.get("via", "new")
    if via not in VIA:
        raise UnreadableEvent(f"payload via of token {name!r} is not one of {sorted(VIA)}")
    klass, share = payload.get("priority_class", "standard"), payload.get("share", 1)
    if klass not in PRIORITY_CLASSES:
        raise UnreadableEvent(f"payload priority_class of token {name!r} is not a class")
    if type(share) is not int or not 1 <= share <= MAX_SHARE:
        raise UnreadableEvent(f"payload share of token {name!r} is not a share")
    return TokenChange(
        name,
        role,
        nodes=scope["nodes"],
        models=scope["models"],
        via=str(via),
        priority_class=str(klass),
        share=share,
        limits=_limits(payload.get("limits"), name, "limits"),
    )


def _limits(value: Any, name: str, key: str) -> ClientLimits:
    try:
        return from_json(value)
    except LimitError as exc:
        raise UnreadableEvent(f"payload {key} of token {name!r}: {exc}") from None
