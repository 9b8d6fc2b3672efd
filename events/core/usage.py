"""A gateway's usage counts, as the event ``usage.recorded`` holds them.

Pure. A gateway counts every finished request in memory (gateway.stages.ledger) per
(client token, model asked, model served, replica, minute) and flushes the counts to
the control plane (``POST /v1/usage``), which keeps each flush's rows in a table of
their own, pending (events.write.usage). Once a minute is closed (its end and a grace
for late flushes past), the roll-up sums the pending rows of all gateways and flushes
into one ``usage.recorded`` event per key (``summed``); a flush of that minute arriving
later still becomes one more event, summed on reading (events.read.ledger).

Schema version 2 (the roll-up's) records ``gateways`` (the posters summed, sorted)
and ``flushes`` (how many flush rows); version 1 (one event a flush row, before the
roll-up) recorded ``gateway`` and ``flush`` and is upcast (events.core.upcast) to
``gateways: [gateway]``, ``flushes: 1``.

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
# flush's id (the gateway's, random): together a flush's identity (events.write.usage).
GATEWAY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
FLUSH = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A client token's name (llmgw.api.guards.tokens.NAME_PATTERN).
CLIENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
OUTCOME = re.compile(r"[a-z][a-z_]{0,31}")
# A model's or replica's name: printable (catalog.forms.printable), 1 to 255 characters.
MAX_NAME = 255
MAX_OUTCOMES = 16
# Posters one summed event names at most (more are counted in ``flushes``, not named).
MAX_GATEWAYS = 64
# Counts beyond this are not a minute of any gateway's traffic.
MAX_COUNT = 10**15
_KEYS = frozenset(
    {
        "gateways",
        "flushes",
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
    # The posters whose flushes this row sums (sorted), and how many flush rows.
    gateways: tuple[str, ...] = ()
    flushes: int = 1

    def payload(self) -> dict[str, Any]:
        return {
            "gateways": list(self.gateways),
            "flushes": self.flushes,
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
            f"tokens ({self.flushes} flushes of {', '.join(self.gateways)})"
        )


def minute_text(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:00Z")


def key_of(row: UsageRow) -> tuple[Any, ...]:
    """What the roll-up sums by: (minute, client, model asked, served, replica)."""
    return (row.minute, row.client, row.model, row.served or "", row.replica or "")


def summed(rows: list[UsageRow]) -> UsageRow:
    """Rows of one key (``key_of``) as one: counts, outcomes and flushes added, the
    gateways' names joined (at most ``MAX_GATEWAYS``)."""
    first = rows[0]
    outcomes: dict[str, int] = {}
    gateways: set[str] = set()
    for row in rows:
        gateways.update(row.gateways)
        for name, count in row.outcomes:
            outcomes[name] = outcomes.get(name, 0) + count
    return UsageRow(
        minute=first.minute,
        client=first.client,
        model=first.model,
        served=first.served,
        replica=first.replica,
        requests=sum(r.requests for r in rows),
        prompt_tokens=sum(r.prompt_tokens for r in rows),
        cached_tokens=sum(r.cached_tokens for r in rows),
        completion_tokens=sum(r.completion_tokens for r in rows),
        estimated=sum(r.estimated for r in rows),
        outcomes=tuple(sorted(outcomes.items())),
        gateways=tuple(sorted(gateways)[:MAX_GATEWAYS]),
        flushes=sum(r.flushes for r in rows),
    )


def summed_within_bounds(rows: list[UsageRow]) -> list[UsageRow]:
    """Rows of one key as few summed rows as keep each what ``check_usage`` reads: every
    count at most ``MAX_COUNT`` and at most ``MAX_OUTCOMES`` outcomes (each row is). One
    row almost always; more only when the rows' sum would pass a bound (a gateway token
    posting counts at the bound, or outcomes of its own naming), so that such rows never
    make the event of the whole key, every gateway's counts of it with them, one that
    replay refuses. In the rows' order."""
    parts: list[list[UsageRow]] = []
    totals: dict[str, int] = {}
    names: set[str] = set()
    for row in rows:
        counts = {key: getattr(row, key) for key in (*COUNTS, "flushes")}
        row_names = {name for name, _ in row.outcomes}
        if (
            not parts
            or any(totals[key] + n > MAX_COUNT for key, n in counts.items())
            or len(names | row_names) > MAX_OUTCOMES
        ):
            parts.append([])
            totals = dict.fromkeys(counts, 0)
            names = set()
        parts[-1].append(row)
        for key, n in counts.items():
            totals[key] += n
        names |= row_names
    return [summed(part) for part in parts]


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
    gateways = _gateways(payload.get("gateways"))
    flushes = payload.get("flushes")
    if type(flushes) is not int or not 1 <= flushes <= MAX_COUNT:
        raise UnreadableEvent(f"usage flushes is not a whole number from 1 to {MAX_COUNT}")
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
        gateways=gateways,
        flushes=flushes,
        **counts,
    )


def _text(payload: dict[str, Any], key: str, pattern: re.Pattern[str]) -> str:
    value = payload.get(key)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise UnreadableEvent(f"usage {key} is not a name (pattern {pattern.pattern})")
    return value


def _gateways(value: Any) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= MAX_GATEWAYS
        or not all(isinstance(v, str) and GATEWAY.fullmatch(v) for v in value)
    ):
        raise UnreadableEvent(
            f"usage gateways is not a list of 1 to {MAX_GATEWAYS} names (pattern {GATEWAY.pattern})"
        )
    return tuple(value)


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
