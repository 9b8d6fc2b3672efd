"""Stored rows as events: the column order every SQL read selects, and a tolerant decoder.

Pure: tuples in, ``StoredEvent``s out. Replay's lean read gives ``ReplayEvent``s,
only what replay reads: on SQLite, which keeps any value in any column, from rows
of every column (``REPLAY_CHECKED_COLUMNS``) whose types ``replay_events`` checks;
a row failing the check is decoded whole by ``decode``, so it is skipped and named
exactly as a whole read names it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from events.core.types import StoredEvent

# The columns of ``events`` in StoredEvent's field order: what every read selects.
EVENT_COLUMNS = (
    "position",
    "event_id",
    "command_id",
    "type",
    "schema_version",
    "model",
    "payload",
    "actor",
    "reason",
    "recorded_at",
)


# What replay reads of a row (events.read.replay): the lean read selects these.
REPLAY_COLUMNS = ("position", "event_id", "type", "schema_version", "payload")
# Every column, replay's first: the lean read on SQLite, which keeps values of any type
# in any column, selects these and checks the others' types (``replay_events``).
REPLAY_CHECKED_COLUMNS = (
    *REPLAY_COLUMNS,
    "command_id",
    "model",
    "actor",
    "reason",
    "recorded_at",
)


class ReplayEvent(msgspec.Struct, gc=False):
    """The part of a stored event that replay judges: built from a lean row for each
    event replayed, so it is built in C (a msgspec Struct: slots, no cycle tracking,
    a third of the cost of a Python ``__init__``); a ``StoredEvent`` has the same
    attributes and may be replayed instead."""

    position: int
    event_id: str
    type: str
    schema_version: int
    payload: str
    unreadable: str | None = None


def lean(event: StoredEvent) -> ReplayEvent:
    """The part of a whole event that replay reads (for a row read again whole)."""
    return ReplayEvent(
        event.position,
        event.event_id,
        event.type,
        event.schema_version,
        event.payload,
        event.unreadable,
    )


def replay_events(
    rows: Sequence[Sequence[Any]], convert: Callable[[Any], Any]
) -> list[ReplayEvent]:
    """Driver rows in ``REPLAY_CHECKED_COLUMNS`` order (``recorded_at`` as stored) as
    replay's events, judged exactly as ``decode`` judges the whole row.

    A row whose columns are all of their types, with a ``recorded_at`` that
    ``datetime.fromisoformat`` reads as a time without a zone (what the store writes
    on SQLite), is one ``decode`` reads as typed: its converter is that parse and
    then sets the zone to UTC, which cannot fail on a time without one. Any other
    row is handed to ``decode`` itself, which reads it or says why not.
    """
    events: list[ReplayEvent] = []
    append = events.append
    parse = datetime.fromisoformat
    for row in rows:
        position, event_id, type_, version, payload, command_id, model, actor, reason, at = row
        if (
            type(event_id) is str
            and type(type_) is str
            and type(version) is int
            and type(payload) is str
            and type(command_id) is str
            and (model is None or type(model) is str)
            and type(actor) is str
            and type(reason) is str
            and type(at) is str
        ):
            try:
                naive = parse(at).tzinfo is None
            except ValueError:
                naive = False
            if naive:
                append(ReplayEvent(position, event_id, type_, version, payload))
                continue
        whole = (position, event_id, command_id, type_, version, model, payload, actor, reason, at)
        append(lean(decode(whole, convert)))
    return events


def to_event(row: Sequence[Any]) -> StoredEvent:
    """A row selected in ``EVENT_COLUMNS`` order, its columns already of their types."""
    position, event_id, command_id, type_, version, model, payload, actor, reason, at = row
    return StoredEvent(
        position, event_id, command_id, type_, version, model, payload, actor, reason, at
    )


def decode(r: Sequence[Any], convert: Callable[[Any], Any]) -> StoredEvent:
    """One driver row (``EVENT_COLUMNS`` order) as a StoredEvent, ``recorded_at`` through
    ``convert``; a row whose columns are not their types (SQLite keeps whatever it
    is given) is still returned, marked unreadable, for replay to skip and name:
    one bad row must not stop a read of the whole log."""
    try:
        at = convert(r[9])
        if (
            type(r[1]) is str
            and type(r[2]) is str
            and type(r[3]) is str
            and type(r[4]) is int
            and (r[5] is None or type(r[5]) is str)
            and type(r[6]) is str
            and type(r[7]) is str
            and type(r[8]) is str
            and isinstance(at, datetime)
        ):
            return StoredEvent(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], at)
        reason = _wrong_columns(r)
    except Exception as exc:
        reason = f"recorded_at {_shown(r[9])} is not a time ({type(exc).__name__})"
    return StoredEvent(
        r[0],
        _as_text(r[1]),
        _as_text(r[2]),
        _as_text(r[3]),
        r[4] if type(r[4]) is int else 0,
        None if r[5] is None else _as_text(r[5]),
        _as_text(r[6]),
        _as_text(r[7]),
        _as_text(r[8]),
        _EPOCH,
        unreadable=reason,
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TEXT_COLUMNS = {1: "event_id", 2: "command_id", 3: "type", 6: "payload", 7: "actor", 8: "reason"}


def _wrong_columns(r: Sequence[Any]) -> str:
    wrong = [f"{name} is {type(r[i]).__name__}" for i, name in _TEXT_COLUMNS.items()]
    wrong = [w for w in wrong if not w.endswith(" is str")]
    if type(r[4]) is not int:
        wrong.append(f"schema_version is {type(r[4]).__name__} {_shown(r[4])}")
    if r[5] is not None and type(r[5]) is not str:
        wrong.append(f"model is {type(r[5]).__name__}")
    return "columns not of their type: " + ", ".join(wrong or ["recorded_at"])


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return repr(value)


def _shown(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
