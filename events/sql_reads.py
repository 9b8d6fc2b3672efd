"""Reading the event log in SQL on the driver's cursor: whole events, and the lean rows
start-up replay reads.

SQL is compiled once per dialect and shape of query; only ``recorded_at`` is
converted, through its column type's own processors, so the events are exactly
those ``conn.execute(query).all()`` would give (tests/integration/
test_store_read_path.py). The lean read for replay selects the five columns
replay uses and, on SQLite, a flag that every column has its proper type; a row
without it is read again whole and decoded by ``events.rows`` (skipped and
named if it cannot be), so a malformed row is judged as before.
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

from events.rows import EVENT_COLUMNS, REPLAY_COLUMNS, ReplayEvent, decode, lean
from events.tables import EventRow
from events.types import StoredEvent

READ_BATCH = 5_000
t: Table = EventRow.__table__  # type: ignore[assignment]  # declarative tables are Tables

_COLUMNS = tuple(t.c[name] for name in EVENT_COLUMNS)
_INSERT_COLUMNS = (*_COLUMNS, t.c.prev_hash, t.c.hash)
Convert = Callable[[Any], Any]
# ``recorded_at`` as the driver gives it, for readers that convert it themselves
# (through ``recorded_at_from_db``, inside events.rows.decode), so that a stored value
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
    (events.rows) turns into events. A lean read for replay selects fewer columns
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
    """``fetch_rows`` on a driver connection (a write section holds one, events.sqlite_log)."""
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
    """One batch of ``read``: whole rows, decoded (events.rows)."""
    rows, convert = fetch_rows(conn, EVENT_COLUMNS, until, model, after)
    return [decode(r, convert) for r in rows]


# Replay's lean read selects ``REPLAY_COLUMNS`` and this flag, true only when every
# column of the row is of its type and ``recorded_at`` is a time ``decode`` reads:
# a row without it is read again whole and decoded (``decode``), so it is skipped
# and named exactly as a whole read would. SQLite keeps whatever it is given, so
# it checks: the column types, and ``recorded_at`` as the text SQLAlchemy writes
# (``YYYY-MM-DD HH:MM:SS.ffffff``, a real date and time: SQLite's ``datetime()``
# gives it back unchanged only then, and year 0 is out of Python's range). The
# flag may be false for a row ``decode`` would read (a time written another way):
# that row only costs a second read. PostgreSQL's columns are typed and NOT NULL.
_SQLITE_ROW_TYPED = (
    "typeof(event_id) = 'text' AND typeof(command_id) = 'text' AND typeof(type) = 'text' "
    "AND typeof(schema_version) = 'integer' AND typeof(model) IN ('text', 'null') "
    "AND typeof(payload) = 'text' AND typeof(actor) = 'text' AND typeof(reason) = 'text' "
    "AND typeof(recorded_at) = 'text' AND recorded_at GLOB "
    "'[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]."
    "[0-9][0-9][0-9][0-9][0-9][0-9]' "
    "AND substr(recorded_at, 1, 4) <> '0000' "
    "AND datetime(substr(recorded_at, 1, 19)) IS substr(recorded_at, 1, 19)"
)


@cache
def _replay_query(sqlite: bool) -> Select[Any]:
    flag: Any = literal_column(_SQLITE_ROW_TYPED if sqlite else "1 = 1")
    query = select(*(t.c[name] for name in REPLAY_COLUMNS), flag)
    query = query.where(t.c.position > bindparam("after"), t.c.position <= bindparam("until"))
    return query.order_by(t.c.position).limit(bindparam("batch", type_=Integer()))


_COMPILED_REPLAY: dict[
    tuple[str, str, str], tuple[str, tuple[str, ...] | None, dict[str, Any]]
] = {}


def fetch_replay_rows(conn: Connection, after: int, until: int) -> list[ReplayEvent]:
    """One batch of replay's lean read (positions ``after < p <= until``)."""
    dialect = conn.dialect
    key = (dialect.name, dialect.driver, dialect.paramstyle)
    found = _COMPILED_REPLAY.get(key)
    if found is None:
        compiled = _replay_query(dialect.name == "sqlite").compile(dialect=dialect)
        order = tuple(compiled.positiontup or ()) if dialect.positional else None
        found = _COMPILED_REPLAY[key] = (compiled.string, order, dict(compiled.params))
    sql, order, fixed = found
    bound = {**fixed, "after": after, "until": until, "batch": READ_BATCH}
    params: Any = bound if order is None else tuple(bound[name] for name in order)
    cursor = conn.connection.cursor()
    try:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    finally:
        cursor.close()
    events = []
    for position, event_id, type_, version, payload, typed in rows:
        if typed:
            events.append(ReplayEvent(position, event_id, type_, version, payload))
        else:
            (whole,) = _fetch_events(conn, position, None, position - 1)
            events.append(lean(whole))
    return events
