"""A gateway's usage counts, as the event ``usage.recorded`` holds them.

Pure. A gateway counts every finished request in memory (gateway.stages.ledger) per
(client token, model asked, model served, replica, minute) and flushes the counts to
the control plane (``POST /v1/usage``); each row of a flush is one ``usage.recorded``
event, appended under the flush's id as the command key, so a flush sent again (its
answer lost) appends nothing twice. The ledger is the sum of these events
(events.read.ledger): several gateways, and several flushes of one gateway within a
minute, are separate events, summed on reading.

Nothing of a prompt or an answer is in a row: names and counts only.

``check_usage`` is replay's (and the route's) reading of a payload: any other shape is
unreadable, skipped and named like every bad row; a good one changes nothing in the
catalog.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from catalog.forms.printable import printable
from events.core.types import CURRENT_SCHEMA, USAGE_RECORDED, NewEvent
from events.core.upcast import UnreadableEvent

# Who posted (a gateway token's name and worker, autoscale.signals.identity) and the
# flush's id (the gateway's, random): together the command key.
GATEWAY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
FLUSH = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A client token's name (llmgw.api.guards.tokens.NAME_PATTERN).
CLIENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
OUTCOME = re.compile(r"[a-z][a-z_]{0,31}")
# A model's or replica's name: printable (catalog.forms.printable), 1 to 255 characters.
MAX_NAME = 255
MAX_OUTCOMES = 16
# Counts beyond this are not a minute of any gateway's traffic.
MAX_COUNT = 10**15
_KEYS = frozenset(
    {
        "gateway",
        "flush",
        "minute",
        "client",
        "model",
        "served",
        "replica",
        "requests",
        "outcomes",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "estimated",
    }
)
COUNTS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "estimated")


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One (client, model asked, model served, replica, minute)'s counts in one flush.

    ``served`` and ``replica`` are None for requests no replica answered (refused,
    unavailable). ``estimated``: the requests whose tokens are the gateway's own count
    (a stream cut before the engine's usage), not the engine's."""

    minute: datetime
    client: str
    model: str
    served: str | None
    replica: str | None
    requests: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    estimated: int = 0
    # (outcome, requests), by outcome; their sum is ``requests``.
    outcomes: tuple[tuple[str, int], ...] = ()
    gateway: str = ""
    flush: str = ""

    def payload(self) -> dict[str, Any]:
        return {
            "gateway": self.gateway,
            "flush": self.flush,
            "minute": minute_text(self.minute),
            "client": self.client,
            "model": self.model,
            "served": self.served,
            "replica": self.replica,
            "requests": self.requests,
            "outcomes": dict(self.outcomes),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "estimated": self.estimated,
        }

    def describe(self) -> str:
        """One line for people (``llmgw history``)."""
        served = f" served by {self.served} on {self.replica}" if self.served else ""
        return (
            f"usage of {self.client} on {self.model}{served} in the minute "
            f"{minute_text(self.minute)}: {self.requests} requests, {self.prompt_tokens} "
            f"prompt ({self.cached_tokens} cached) and {self.completion_tokens} completion "
            f"tokens (gateway {self.gateway})"
        )


def minute_text(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:00Z")


def event_for(row: UsageRow) -> NewEvent:
    # ``model`` stays empty: `history --model` lists the model's changes, not its traffic.
    return NewEvent(
        type=USAGE_RECORDED,
        model="",
        payload=json.dumps(row.payload(), separators=(",", ":")),
        schema_version=CURRENT_SCHEMA[USAGE_RECORDED],
    )


def check_usage(payload: Any) -> UsageRow:
    """A ``usage.recorded`` payload (upcast) read and checked whole; ``UnreadableEvent``
    naming the first field that is wrong, and what it must be."""
    if not isinstance(payload, dict):
        raise UnreadableEvent("usage payload is not a JSON object")
    extra = sorted(k for k in payload if k not in _KEYS)
    if extra:
        raise UnreadableEvent(f"usage payload has unknown fields {extra[:5]}")
    gateway = _text(payload, "gateway", GATEWAY)
    flush = _text(payload, "flush", FLUSH)
    client = _text(payload, "client", CLIENT)
    model = _name(payload, "model")
    served = _optional(payload, "served")
    replica = _optional(payload, "replica")
    if (served is None) != (replica is None):
        raise UnreadableEvent("usage served and replica must both be given, or both null")
    minute = _minute(payload.get("minute"))
    counts = {key: _count(payload, key) for key in COUNTS}
    if counts["requests"] < 1:
        raise UnreadableEvent("usage requests must be at least 1")
    if counts["estimated"] > counts["requests"]:
        raise UnreadableEvent("usage estimated is more than its requests")
    if counts["cached_tokens"] > counts["prompt_tokens"]:
        raise UnreadableEvent("usage cached_tokens is more than its prompt_tokens")
    outcomes = _outcomes(payload.get("outcomes"))
    if sum(n for _, n in outcomes) != counts["requests"]:
        raise UnreadableEvent("usage outcomes do not add up to its requests")
    return UsageRow(
        minute=minute,
        client=client,
        model=model,
        served=served,
        replica=replica,
        outcomes=outcomes,
        gateway=gateway,
        flush=flush,
        **counts,
    )


def _text(payload: dict[str, Any], key: str, pattern: re.Pattern[str]) -> str:
    value = payload.get(key)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise UnreadableEvent(f"usage {key} is not a name (pattern {pattern.pattern})")
    return value


def _name(payload: dict[str, Any], key: str) -> str:
    value = payload.get(key)
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME or not printable(value):
        raise UnreadableEvent(f"usage {key} is not a name (1 to {MAX_NAME} printable characters)")
    return value


def _optional(payload: dict[str, Any], key: str) -> str | None:
    if payload.get(key) is None:
        return None
    try:
        return _name(payload, key)
    except UnreadableEvent:
        raise UnreadableEvent(
            f"usage {key} is neither null nor a name (1 to {MAX_NAME} printable characters)"
        ) from None


def _count(payload: dict[str, Any], key: str) -> int:
    value = payload.get(key)
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise UnreadableEvent(f"usage {key} is not a whole number from 0 to {MAX_COUNT}")
    return value


def _minute(value: Any) -> datetime:
    if not isinstance(value, str) or len(value) > 40:
        raise UnreadableEvent("usage minute is not a time (ISO 8601, a whole minute, UTC)")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise UnreadableEvent(
            "usage minute is not a time (ISO 8601, a whole minute, UTC)"
        ) from None
    if when.tzinfo is None or when.utcoffset() or when.second or when.microsecond:
        raise UnreadableEvent(f"usage minute {value!r} is not a whole minute in UTC")
    return when.astimezone(UTC)


def _outcomes(value: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, dict) or len(value) > MAX_OUTCOMES:
        raise UnreadableEvent(f"usage outcomes is not an object of at most {MAX_OUTCOMES} outcomes")
    out = []
    for name, count in value.items():
        if not isinstance(name, str) or not OUTCOME.fullmatch(name):
            raise UnreadableEvent("usage outcomes has a name that is not an outcome")
        if type(count) is not int or not 0 <= count <= MAX_COUNT:
            raise UnreadableEvent(f"usage outcomes {name} is not a whole number")
        out.append((name, count))
    return tuple(sorted(out))
