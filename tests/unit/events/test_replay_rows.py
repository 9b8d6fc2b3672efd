"""Replay's lean read on SQLite checks each row's column types in Python
(``events.core.rows.replay_events``) instead of asking SQLite for a flag: a row must be
judged exactly as ``events.core.rows.decode`` judges the whole row, whatever each column
holds (SQLite stores any value in any column)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.dialects import sqlite

from events.core.rows import EVENT_COLUMNS, REPLAY_CHECKED_COLUMNS, decode, lean, replay_events
from events.storage.sql_reads import recorded_at_from_db

CONVERT = recorded_at_from_db(sqlite.dialect())

_TIMES = st.sampled_from(
    [
        "2026-01-01 19:01:00.730000",  # what the store writes
        "2026-01-01 19:01:00",
        "2026-01-01T19:01:00+05:00",  # a zone: converted to UTC
        "0001-01-01T00:00:00+01:00",  # a zone that moves it out of range
        "9999-12-31 23:59:59.999999",
        "2026-02-30 00:00:00.000000",  # no such day
        "2026-01-01 24:00:00.000000",
        "2026-01-01",
        "yesterday",
        "",
    ]
)


def _anything() -> st.SearchStrategy[Any]:
    return (
        st.none()
        | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False)
        | st.binary(max_size=8)
        | st.text(max_size=8)
        | _TIMES
    )


# What `_rows` draws, built once: built in the composite, each was a new strategy that
# hypothesis validated again on every draw.
_POSITION = st.integers(1, 10**6)
_EVENT_ID = st.text(max_size=6)
_TYPE = st.sampled_from(["model.added", "model.removed", "x"])
_VERSION = st.integers(-1, 3)
_PAYLOAD = st.text(max_size=10)
_MODEL = st.none() | st.text(max_size=4)
_ODD_COLUMNS = st.lists(st.sampled_from(REPLAY_CHECKED_COLUMNS[1:]), max_size=3)
_ANYTHING = _anything()


@st.composite
def _rows(draw: st.DrawFn) -> tuple[Any, ...]:
    """A row in REPLAY_CHECKED_COLUMNS order: usually well-typed, with a few columns of
    any value at all."""
    values: dict[str, Any] = {
        "position": draw(_POSITION),
        "event_id": draw(_EVENT_ID),
        "type": draw(_TYPE),
        "schema_version": draw(_VERSION),
        "payload": draw(_PAYLOAD),
        "command_id": "c",
        "model": draw(_MODEL),
        "actor": "a",
        "reason": "",
        "recorded_at": draw(_TIMES),
    }
    for column in draw(_ODD_COLUMNS):
        values[column] = draw(_ANYTHING)
    return tuple(values[c] for c in REPLAY_CHECKED_COLUMNS)


def _fields(event: Any) -> tuple[Any, ...]:
    return (
        event.position,
        event.event_id,
        event.type,
        event.schema_version,
        event.payload,
        event.unreadable,
    )


@given(st.lists(_rows(), max_size=5))
def test_a_checked_row_is_judged_as_decoding_the_whole_row_judges_it(
    rows: list[tuple[Any, ...]],
) -> None:
    whole = [
        tuple(row[REPLAY_CHECKED_COLUMNS.index(name)] for name in EVENT_COLUMNS) for row in rows
    ]

    checked = replay_events(rows, CONVERT)

    assert [_fields(e) for e in checked] == [_fields(lean(decode(w, CONVERT))) for w in whole]


def test_a_row_as_the_store_writes_it_is_read_without_decoding_it_whole() -> None:
    row = (7, "e", "model.removed", 1, '{"name": "m"}', "c", "m", "a", "", "2026-01-01 00:00:00")

    (event,) = replay_events([row], CONVERT)

    assert _fields(event) == (7, "e", "model.removed", 1, '{"name": "m"}', None)
    assert CONVERT(row[-1]) == datetime(2026, 1, 1, tzinfo=UTC)


def test_a_row_with_a_column_of_the_wrong_type_is_named() -> None:
    row = (3, "e", "model.added", "two", b"\xff", "c", None, "a", "", "yesterday")

    (event,) = replay_events([row], CONVERT)

    assert event.unreadable is not None
    assert "recorded_at 'yesterday' is not a time" in event.unreadable
