"""Reading the event log in SQL on the driver's cursor: whole events, and the lean rows
start-up replay reads.

SQL is compiled once per dialect and shape of query; only ``recorded_at`` is
converted, through its column type's own processors, so the events are exactly
those ``conn.execute(query).all()`` would give (tests/integration/
test_store_read_path.py). The lean read for replay selects the five columns
replay uses on PostgreSQL, and every column on SQLite, whose types
``events.core.rows.replay_events`` checks; a row that fails the check is decoded whole
by ``events.core.rows.decode`` (skipped and named if it cannot be read), so a
malformed row is judged as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from sqlalchemy import (
    Connection,
    Dialect,
    Integer,
    Select,
    String,
    Table,
    bindparam,
    literal_column,
    select,
    type_coerce,
)

from events.core.rows import (
    EVENT_COLUMNS,
    REPLAY_CHECKED_COLUMNS,
    REPLAY_COLUMNS,
    ReplayEvent,
    decode,
    replay_events,
)
from events.core.types import StoredEvent
from events.database.tables import EventRow

READ_BATCH = 5_000
t: Table = EventRow.__table__  # type: ignore[assignment]  # declarative tables are Tables

_COLUMNS = tuple(t.c[name] for name in EVENT_COLUMNS)
_INSERT_COLUMNS = (*_COLUMNS, t.c.prev_hash, t.c.hash)
Convert = Callable[[Any], Any]
# ``recorded_at`` as the driver gives it, for readers that convert it themselves
# (through ``recorded_at_from_db``, inside events.core.rows.decode), so that a stored value
# that is not a time is named rather than raised by SQLAlchemy's processor.
RAW_RECORDED_AT = type_coerce(t.c.recorded_at, String).label("recorded_at")


def _same(value: Any) -> Any:
    return value


def recorded_at_from_db(dialect: Dialect) -> Convert:
    """The ``recorded_at`` column type's own result processor on ``dialect``."""
    at_type = t.c.recorded_at.type.dialect_impl(dialect)
    return at_type.result_processor(dialect, None) or _same


@cache
def _read_query(columns: tuple[str, ...], until: bool, model: bool) -> Select[Any]:
    """The select a read runs, one per set of columns and shape; every value is bound, the
    batch size too (``READ_BATCH`` is read at each call, so nothing cached here goes stale)."""
    query = select(*(t.c[name] for name in columns)).where(t.c.position > bindparam("after"))
    if until:
        query = query.where(t.c.position <= bindparam("until"))
    if model:
        query = query.where(t.c.model == bindparam("model"))
    return query.order_by(t.c.position).limit(bindparam("batch", type_=Integer()))


_CompiledRead = tuple[str, tuple[str, ...] | None, dict[str, Any], Convert]
_COMPILED_READS: dict[tuple[str, str, str, tuple[str, ...], bool, bool], _CompiledRead] = {}


def _compiled_read(
    dialect: Dialect, columns: tuple[str, ...], until: bool, model: bool
) -> _CompiledRead:
    """SQL text, positional order of the binds, their fixed values, and the time converter."""
    key = (dialect.name, dialect.driver, dialect.paramstyle, columns, until, model)
    found = _COMPILED_READS.get(key)
    if found is None:
        compiled = _read_query(columns, until, model).compile(dialect=dialect)
        order = tuple(compiled.positiontup or ()) if dialect.positional else None
        convert = recorded_at_from_db(dialect)
        found = _COMPILED_READS[key] = (compiled.string, order, dict(compiled.params), convert)
    return found


def fetch_rows(
    conn: Connection,
    columns: tuple[str, ...],
    until: int | None,
    model: str | None,
    after: int,
) -> tuple[Sequence[Any], Convert]:
    """One batch of a read of ``columns`` (positions ``after < p <= until``), as the
    driver's own tuples, with the converter of ``recorded_at``: what a decoder
    (events.core.rows) turns into events. A lean read for replay selects fewer columns
    and decodes them its own way; this is the seam it plugs into."""
    return fetch_driver_rows(
        conn.connection, conn.dialect, columns, until=until, model=model, after=after
    )


def fetch_driver_rows(
    dbapi_conn: Any,
    dialect: Dialect,
    columns: tuple[str, ...],
    *,
    until: int | None,
    model: str | None,
    after: int,
) -> tuple[Sequence[Any], Convert]:
    """``fetch_rows`` on a driver connection (a write section holds one: sqlite_log)."""
    sql, order, fixed, convert = _compiled_read(
        dialect, columns, until is not None, model is not None
    )
    bound = {**fixed, "after": after, "until": until, "model": model, "batch": READ_BATCH}
    params: Any = bound if order is None else tuple(bound[name] for name in order)
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(sql, params)
        return cursor.fetchall(), convert
    finally:
        cursor.close()


def _fetch_events(
    conn: Connection, until: int | None, model: str | None, after: int
) -> list[StoredEvent]:
    """One batch of ``read``: whole rows, decoded (events.core.rows)."""
    rows, convert = fetch_rows(conn, EVENT_COLUMNS, until, model, after)
    return [decode(r, convert) for r in rows]


# Replay's lean read. On PostgreSQL the columns are typed and NOT NULL, so it selects
# ``REPLAY_COLUMNS`` alone. SQLite keeps whatever it is given, so there it selects the
# other columns too (``REPLAY_CHECKED_COLUMNS``) and ``events.core.rows.replay_events`` checks
# their types in Python, which costs a third of asking SQLite for a ``typeof()`` flag
# (bench/events/replay.py's read-paths table). A row that fails the check is decoded whole by
# ``events.core.rows.decode`` from the values already fetched, so it is skipped and named
# exactly as a whole read would name it.
#
# Fetching every column makes the driver decode the text of all of them; a column whose
# bytes are not UTF-8 (only a raw ``CAST(x'ff' AS TEXT)`` can store one) comes back as
# bytes (events.database.sqlite_text), fails the check and is named like any value of the
# wrong type.


@cache
def _replay_query(kind: str) -> Select[Any]:
    """``kind``: "typed" (PostgreSQL, the five columns) or "checked" (SQLite, every
    column, checked in Python)."""
    if kind == "checked":
        query = select(*(t.c[name] for name in REPLAY_CHECKED_COLUMNS[:-1]), RAW_RECORDED_AT)
    else:
        flag: Any = literal_column("1 = 1")
        query = select(*(t.c[name] for name in REPLAY_COLUMNS), flag)
    query = query.where(t.c.position > bindparam("after"), t.c.position <= bindparam("until"))
    return query.order_by(t.c.position).limit(bindparam("batch", type_=Integer()))


_COMPILED_REPLAY: dict[
    tuple[str, str, str, str], tuple[str, tuple[str, ...] | None, dict[str, Any], Convert]
] = {}


def _replay_batch(
    conn: Connection, kind: str, after: int, until: int
) -> tuple[Sequence[Any], Convert]:
    dialect = conn.dialect
    key = (dialect.name, dialect.driver, dialect.paramstyle, kind)
    found = _COMPILED_REPLAY.get(key)
    if found is None:
        compiled = _replay_query(kind).compile(dialect=dialect)
        order = tuple(compiled.positiontup or ()) if dialect.positional else None
        convert = recorded_at_from_db(dialect)
        found = _COMPILED_REPLAY[key] = (compiled.string, order, dict(compiled.params), convert)
    sql, order, fixed, convert = found
    bound = {**fixed, "after": after, "until": until, "batch": READ_BATCH}
    params: Any = bound if order is None else tuple(bound[name] for name in order)
    cursor = conn.connection.cursor()
    try:
        cursor.execute(sql, params)
        return cursor.fetchall(), convert
    finally:
        cursor.close()


def fetch_replay_rows(conn: Connection, after: int, until: int) -> list[ReplayEvent]:
    """One batch of replay's lean read (positions ``after < p <= until``)."""
    if conn.dialect.name != "sqlite":
        rows, _ = _replay_batch(conn, "typed", after, until)
        return [ReplayEvent(p, e, t_, v, pl) for p, e, t_, v, pl, _ in rows]
    rows, convert = _replay_batch(conn, "checked", after, until)
    return replay_events(rows, convert)
