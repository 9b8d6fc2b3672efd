"""The usage ledger: the ``usage.recorded`` events of the log, and the flushed rows not
yet rolled up into events (``usage_pending``), summed.

Pure: events and rows in, totals out. Every gateway flushes its own counts, several
times a minute; the roll-up sums a closed minute's rows of all gateways into one event
per key (events.core.usage), and a late flush of that minute into one more. The ledger
of a client and model is the sum of all of them, events and pending rows: a flush
counts as soon as it is stored. Each event is read on its own as replay reads it, each
pending row as the roll-up does (``read_pending``): one that cannot be read (a
hand-edited payload, a newer release's) is skipped and named, never summed and never
the end of the ledger.

``LedgerQuery`` filters by client, model (the model asked) and the rows' minutes
(``since``: from the minute it falls in), and groups by ``client``, ``model``, ``day``
or, without ``by``, by client and model together.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from catalog import CatalogError
from catalog.reading.documents import Limits, read_json
from events.core.rows import ReplayEvent
from events.core.types import USAGE_RECORDED, StoredEvent
from events.core.upcast import UnreadableEvent, upcast
from events.core.usage import UsageRow, check_usage
from events.storage.usage_pending import PendingRow

BY = ("client", "model", "day")
# A row is a few hundred bytes; anything much larger is not one.
ROW_LIMITS = Limits(max_bytes=64 << 10, max_depth=4, max_nodes=1_000)
# The groups an answer holds at most (``GET /v1/usage``'s bound); beyond, ``truncated``.
MAX_GROUPS = 10_000
# The skipped rows an answer names at most (their count is always whole).
MAX_NAMED = 100


@dataclass(frozen=True, slots=True)
class LedgerQuery:
    client: str | None = None
    model: str | None = None
    since: datetime | None = None
    by: str | None = None


@dataclass(slots=True)
class Totals:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    estimated: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def add(self, row: UsageRow) -> None:
        self.requests += row.requests
        self.prompt_tokens += row.prompt_tokens
        self.cached_tokens += row.cached_tokens
        self.completion_tokens += row.completion_tokens
        self.estimated += row.estimated
        for name, count in row.outcomes:
            self.outcomes[name] = self.outcomes.get(name, 0) + count

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "estimated": self.estimated,
            "outcomes": dict(sorted(self.outcomes.items())),
        }


@dataclass(frozen=True, slots=True)
class SkippedRow:
    position: int
    event_id: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"position": self.position, "event_id": self.event_id, "reason": self.reason}


@dataclass(slots=True)
class Ledger:
    """The totals per group (its key's values, in ``keys`` order), in key order."""

    keys: tuple[str, ...]
    groups: dict[tuple[str, ...], Totals] = field(default_factory=dict)
    total: Totals = field(default_factory=Totals)
    rows: int = 0
    skipped: list[SkippedRow] = field(default_factory=list)
    skipped_count: int = 0
    truncated: bool = False
    # The last position read: the ledger is as of it.
    position: int = 0
    # Of ``rows``, those still pending (stored, not yet rolled up into events).
    pending: int = 0
    max_groups: int = MAX_GROUPS

    def to_json(self) -> dict[str, Any]:
        groups = []
        for key in sorted(self.groups):
            groups.append({**dict(zip(self.keys, key, strict=True)), **self.groups[key].to_json()})
        return {
            "by": list(self.keys),
            "position": self.position,
            "rows": self.rows,
            "pending": self.pending,
            "groups": groups,
            "total": self.total.to_json(),
            "truncated": self.truncated,
            "skipped": [s.to_json() for s in self.skipped],
            "skipped_count": self.skipped_count,
        }


def minute_of(when: datetime) -> datetime:
    """The minute ``when`` is in: ``since`` counts that whole minute."""
    return when.replace(second=0, microsecond=0)


def keys_of(by: str | None) -> tuple[str, ...]:
    if by is None:
        return ("client", "model")
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}, not {by!r}")
    return (by,)


def read_row(event: StoredEvent | ReplayEvent) -> UsageRow:
    """One stored ``usage.recorded`` event's row; ``UnreadableEvent`` naming why not."""
    if event.unreadable is not None:
        raise UnreadableEvent(event.unreadable)
    if event.type != USAGE_RECORDED:
        raise UnreadableEvent(f"not a usage event ({event.type!r})")
    try:
        payload = read_json(event.payload, "payload", ROW_LIMITS)
    except CatalogError as exc:
        raise UnreadableEvent(str(exc)[:300]) from None
    if not isinstance(payload, dict):
        raise UnreadableEvent("payload is not a JSON object")
    return check_usage(upcast(event.type, event.schema_version, payload))


def pending_id(row: PendingRow) -> str:
    """How a pending row is named where an event is named by its id."""
    return f"usage_pending:{row.id}"


def read_pending(row: PendingRow) -> UsageRow:
    """One pending row (``usage_pending``, as stored) as the flush posted it;
    ``UnreadableEvent`` naming why not."""
    if not isinstance(row.row, str) or not isinstance(row.poster, str):
        raise UnreadableEvent("pending usage row is not text")
    try:
        payload = read_json(row.row, "row", ROW_LIMITS)
    except CatalogError as exc:
        raise UnreadableEvent(str(exc)[:300]) from None
    if not isinstance(payload, dict) or "gateways" in payload or "flushes" in payload:
        raise UnreadableEvent("pending usage row is not a flush's row (a JSON object)")
    return check_usage({**payload, "gateways": [row.poster], "flushes": 1})


def summarise(
    events: Iterable[StoredEvent | ReplayEvent],
    query: LedgerQuery,
    max_groups: int = MAX_GROUPS,
    max_events: int | None = None,
    pending: Iterable[PendingRow] = (),
) -> Ledger:
    """The ledger of ``events`` (the log's ``usage.recorded`` events, in log order) and
    ``pending`` (the rows not yet rolled up, ``pending`` in the answer); with
    ``max_events``, of at most that many events (then ``truncated``, and ``position``
    the last one read: the ledger up to it)."""
    keys = keys_of(query.by)
    ledger = Ledger(keys, max_groups=max_groups)
    since = None if query.since is None else minute_of(query.since)
    read = 0
    for event in events:
        if max_events is not None and read >= max_events:
            ledger.truncated = True
            break
        read += 1
        ledger.position = max(ledger.position, event.position)
        try:
            row = read_row(event)
        except Exception as exc:  # any bad row is one bad row: skipped and named
            _skip(ledger, event.position, event.event_id, exc)
            continue
        _count(ledger, query, since, row)
    for stored in pending:
        try:
            row = read_pending(stored)
        except Exception as exc:  # the same for a bad pending row
            _skip(ledger, 0, pending_id(stored), exc)
            continue
        if _count(ledger, query, since, row):
            ledger.pending += 1
    return ledger


def _skip(ledger: Ledger, position: int, name: str, exc: Exception) -> None:
    reason = str(exc) if isinstance(exc, UnreadableEvent) else f"{type(exc).__name__}"
    ledger.skipped_count += 1
    if len(ledger.skipped) < MAX_NAMED:
        ledger.skipped.append(SkippedRow(position, name, reason[:300]))


def _count(ledger: Ledger, query: LedgerQuery, since: datetime | None, row: UsageRow) -> bool:
    if query.client is not None and row.client != query.client:
        return False
    if query.model is not None and row.model != query.model:
        return False
    if since is not None and row.minute < since:
        return False
    ledger.rows += 1
    ledger.total.add(row)
    key = tuple(_value(row, k) for k in ledger.keys)
    found = ledger.groups.get(key)
    if found is None:
        if len(ledger.groups) >= ledger.max_groups:
            ledger.truncated = True
            return True
        found = ledger.groups[key] = Totals()
    found.add(row)
    return True


def _value(row: UsageRow, key: str) -> str:
    if key == "day":
        return row.minute.strftime("%Y-%m-%d")
    return row.client if key == "client" else row.model
