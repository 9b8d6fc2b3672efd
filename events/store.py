"""The event log in SQL: what SQLite and PostgreSQL share (events.sqlite_log, events.postgres_log).

Reads and appends run on the driver's own cursor, with SQL compiled once per
dialect and shape of query: start-up reads the whole log, and SQLAlchemy's
per-row and per-statement work (a ``Row`` per row, a type processor per value,
cache keys) cost more than everything else about reading it, and as much as the
commit itself for an append. The statements are the same ones; only
``recorded_at`` is converted, through its column type's own processors
(``UTCDateTime``), so the events are exactly those ``conn.execute(query).all()``
would give (tests/integration/test_store_read_path.py).

What differs between the back ends is how the write lock is taken
(``SqlLog._lock``); everything else is here. The log's guarantees are
events.log's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    Connection,
    Dialect,
    Engine,
    Integer,
    Select,
    Table,
    bindparam,
    func,
    insert,
    select,
)

from events.chain_rows import chain_hash_at
from events.db import WRITE
from events.log import AppendOutcome, ConcurrencyConflict, chained_rows
from events.rows import EVENT_COLUMNS, decode, to_event
from events.tables import EventRow
from events.types import NewEvent, StoredEvent

READ_BATCH = 5_000
t: Table = EventRow.__table__  # type: ignore[assignment]  # declarative tables are Tables

_COLUMNS = tuple(t.c[name] for name in EVENT_COLUMNS)
_INSERT_COLUMNS = (*_COLUMNS, t.c.prev_hash, t.c.hash)
Convert = Callable[[Any], Any]


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
        at_type = t.c.recorded_at.type.dialect_impl(dialect)
        convert = at_type.result_processor(dialect, None) or (lambda value: value)
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
    sql, order, fixed, convert = _compiled_read(
        conn.dialect, columns, until is not None, model is not None
    )
    bound = {**fixed, "after": after, "until": until, "model": model, "batch": READ_BATCH}
    params: Any = bound if order is None else tuple(bound[name] for name in order)
    cursor = conn.connection.cursor()
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


_CompiledAppend = tuple[str, str, tuple[str, ...] | None, Convert, Convert]
_COMPILED_APPENDS: dict[tuple[str, str, str], _CompiledAppend] = {}


def _compiled_append(dialect: Dialect) -> _CompiledAppend:
    """The two statements of an append, compiled once per dialect: the last row
    (position, time, hash) and the insert, with the time's bind and result converters."""
    key = (dialect.name, dialect.driver, dialect.paramstyle)
    found = _COMPILED_APPENDS.get(key)
    if found is None:
        last = (
            select(t.c.position, t.c.recorded_at, t.c.hash)
            .order_by(t.c.position.desc())
            .limit(1)
            .compile(dialect=dialect, compile_kwargs={"literal_binds": True})
        )
        insert_stmt = insert(t).values({c.name: bindparam(c.name) for c in _INSERT_COLUMNS})
        compiled = insert_stmt.compile(dialect=dialect)
        order = tuple(compiled.positiontup or ()) if dialect.positional else None
        at_type = t.c.recorded_at.type.dialect_impl(dialect)
        to_db = at_type.bind_processor(dialect) or (lambda value: value)
        from_db = at_type.result_processor(dialect, None) or (lambda value: value)
        found = _COMPILED_APPENDS[key] = (last.string, compiled.string, order, to_db, from_db)
    return found


def _by_command(conn: Connection, key: str) -> tuple[StoredEvent, ...]:
    rows = conn.execute(select(*_COLUMNS).where(t.c.command_id == key).order_by(t.c.position))
    return tuple(to_event(r) for r in rows.all())


class SqlLog:
    """The log over one database (a ``Log``). Thread-safe as far as its engine's pool is.

    Open one with ``open_log`` (events.open), which picks the back end's subclass.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- reading ----------------------------------------------------------

    def head(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.coalesce(func.max(t.c.position), 0))).scalar_one())

    def read(
        self, after: int = 0, until: int | None = None, *, model: str | None = None
    ) -> Iterator[StoredEvent]:
        """As ``Log.read``, streamed in batches.

        Each batch is its own short read so that a reader of a million events
        holds no transaction open (and on SQLite no WAL snapshot) for long.
        """
        last = after
        while True:
            with self.engine.connect() as conn:
                events = _fetch_events(conn, until, model, last)
            yield from events
            if len(events) < READ_BATCH:
                return
            last = events[-1].position

    def position_at(self, when: datetime) -> int:
        query = select(func.coalesce(func.max(t.c.position), 0)).where(t.c.recorded_at <= when)
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def by_command(self, key: str) -> tuple[StoredEvent, ...]:
        with self.engine.connect() as conn:
            return _by_command(conn, key)

    # -- writing ----------------------------------------------------------

    def append(
        self,
        events: Sequence[NewEvent],
        *,
        expected_head: int | None,
        actor: str = "",
        reason: str = "",
        key: str | None = None,
        now: datetime | None = None,
    ) -> AppendOutcome:
        with self.writing() as log:
            return log.append(
                events, expected_head=expected_head, actor=actor, reason=reason, key=key, now=now
            )

    @contextmanager
    def writing(self) -> Iterator[SqlLockedLog]:
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            self._lock(conn)
            yield SqlLockedLog(conn)

    def _lock(self, conn: Connection) -> None:
        """Take the log's write lock inside ``conn``'s transaction (per back end)."""
        raise NotImplementedError


class SqlLockedLog:
    """The log inside a write transaction that holds its lock (``SqlLog.writing``)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def read(self, after: int) -> Iterator[StoredEvent]:
        while True:
            events = _fetch_events(self.conn, None, None, after)
            yield from events
            if len(events) < READ_BATCH:
                return
            after = events[-1].position

    def by_command(self, key: str) -> tuple[StoredEvent, ...]:
        return _by_command(self.conn, key)

    def append(
        self,
        events: Sequence[NewEvent],
        *,
        expected_head: int | None,
        actor: str = "",
        reason: str = "",
        key: str | None = None,
        now: datetime | None = None,
    ) -> AppendOutcome:
        if not events:
            raise ValueError("nothing to append")
        conn = self.conn
        if key is not None:
            previous = _by_command(conn, key)
            if previous:
                return AppendOutcome(previous, already_recorded=True)
        last_sql, insert_sql, order, to_db, from_db = _compiled_append(conn.dialect)
        cursor = conn.connection.cursor()
        try:
            cursor.execute(last_sql)
            last = cursor.fetchone()
            head, last_time = (int(last[0]), from_db(last[1])) if last else (0, None)
            if expected_head is not None and head != expected_head:
                raise ConcurrencyConflict(expected_head, head)
            prev_hash: str = (
                last[2] if last is not None and last[2] is not None else chain_hash_at(conn, head)
            )
            rows = chained_rows(
                events,
                head=head,
                prev_hash=prev_hash,
                last_time=last_time,
                actor=actor,
                reason=reason,
                key=key,
                now=now,
            )
            params = [
                {
                    **{name: getattr(event, name) for name in EVENT_COLUMNS},
                    "recorded_at": to_db(event.recorded_at),
                    "prev_hash": prev,
                    "hash": value,
                }
                for event, prev, value in rows
            ]
            if order is not None:
                cursor.executemany(insert_sql, [tuple(p[n] for n in order) for p in params])
            else:
                cursor.executemany(insert_sql, params)
        finally:
            cursor.close()
        return AppendOutcome(tuple(event for event, _, _ in rows), already_recorded=False)
