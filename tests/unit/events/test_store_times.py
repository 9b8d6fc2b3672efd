"""An append writes and reads ``recorded_at`` on SQLite exactly as its column type does.

The write section converts the time itself (events.storage.sql_log ``_to_db``, ``_from_db``)
rather than through ``UTCDateTime``'s processors; these properties hold the two to
the same text written and the same time read, or the same refusal, for any time in
any zone and any stored text, so rows, hashes and the clamp of ``recorded_at`` are
what they were.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st
from sqlalchemy.dialects import sqlite

from events.storage.sql_log import _writes
from events.storage.sql_reads import recorded_at_from_db, t

DIALECT = sqlite.dialect()
WRITES = _writes(DIALECT)
_BIND = t.c.recorded_at.type.dialect_impl(DIALECT).bind_processor(DIALECT)
# UTCDateTime converts on SQLite; the strategies below call it, so a None must fail here.
assert _BIND is not None
TO_DB: Callable[[Any], Any] = _BIND
FROM_DB = recorded_at_from_db(DIALECT)

zones = st.one_of(
    st.just(UTC),
    st.none(),
    st.integers(-23 * 60, 23 * 60).map(lambda m: timezone(timedelta(minutes=m))),
)


def _outcome(convert: Any, value: object) -> object:
    try:
        return ("value", convert(value))
    except Exception as exc:
        return ("refused", type(exc))


@example(datetime(1, 1, 1, tzinfo=UTC))
@example(datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC))
@given(st.datetimes(timezones=zones))
def test_a_time_is_written_as_the_column_type_writes_it(at: datetime) -> None:
    assert TO_DB is not None
    assert _outcome(WRITES.to_db, at) == _outcome(TO_DB, at)


stored_text = st.one_of(
    st.datetimes(timezones=zones).map(lambda at: TO_DB(at) if at.tzinfo else at.isoformat()),
    st.datetimes().map(lambda at: at.isoformat(" ")),
    st.datetimes(timezones=zones).map(str),
    st.text(max_size=30),
    st.integers(),
    st.none(),
)


@example("2026-12-03 10:00:00.000+01")
@example("2026-12-03 10:00:00,000000")
@given(stored_text)
def test_a_stored_time_is_read_as_the_column_type_reads_it(value: object) -> None:
    assert _outcome(WRITES.from_db, value) == _outcome(FROM_DB, value)
