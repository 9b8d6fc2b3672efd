"""The event log in SQL: what SQLite and PostgreSQL share (events.sqlite_log, events.postgres_log).

Reads and appends run on the driver's own cursor, with SQL compiled once per
dialect and shape of query: start-up reads the whole log, and SQLAlchemy's
per-row and per-statement work (a ``Row`` per row, a type processor per value,
cache keys) cost more than everything else about reading it, and as much as the
commit itself for an append. The statements are the same ones; only
``recorded_at`` is converted, through its column type's own processors
(``UTCDateTime``), so the events are exactly those ``conn.execute(query).all()``
would give (tests/integration/test_store_read_path.py).

What differs between the back ends is how a write section begins, takes the
log's lock and ends (``SqlLog.writing``: events.sqlite_log on the driver's
connection, events.postgres_log inside SQLAlchemy's transaction); the
statements of a section (``SqlLockedLog``) are here, compiled once per dialect
(``_writes``). The log's guarantees are events.log's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
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
    literal_column,
    select,
)
from sqlalchemy.exc import DBAPIError

from events.chain import GENESIS
from events.chain_rows import adoption_table, seal_table
from events.log import AppendOutcome, ConcurrencyConflict, UnvouchedRow, chained_rows
from events.rows import EVENT_COLUMNS, REPLAY_COLUMNS, ReplayEvent, decode, lean
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


# -- the write side: statements compiled once per dialect, run on the driver's cursor --


@dataclass(frozen=True, slots=True)
class _Statement:
    """One compiled statement: its text, the order of its binds if the driver's
    paramstyle is positional (None: named), and the values compilation fixed."""

    sql: str
    order: tuple[str, ...] | None
    fixed: dict[str, Any]

    def params(self, values: dict[str, Any]) -> Any:
        bound = {**self.fixed, **values} if self.fixed else values
        return bound if self.order is None else tuple(bound[name] for name in self.order)


def _statement(dialect: Dialect, stmt: Any, **compile_kwargs: Any) -> _Statement:
    compiled = stmt.compile(dialect=dialect, compile_kwargs=compile_kwargs)
    order = tuple(compiled.positiontup or ()) if dialect.positional else None
    return _Statement(compiled.string, order, dict(compiled.params))


@dataclass(frozen=True, slots=True)
class _Writes:
    """What a write section runs, compiled once per dialect, with the converters of
    ``recorded_at`` (its column type's own, ``UTCDateTime``) to and from the driver."""

    last: _Statement  # position, recorded_at and hash of the last row
    insert: _Statement
    by_command: _Statement
    seal: _Statement
    adopted: _Statement
    to_db: Convert
    from_db: Convert


_WRITES: dict[tuple[str, str, str], _Writes] = {}


def _writes(dialect: Dialect) -> _Writes:
    key = (dialect.name, dialect.driver, dialect.paramstyle)
    found = _WRITES.get(key)
    if found is None:
        at_type = t.c.recorded_at.type.dialect_impl(dialect)
        found = _WRITES[key] = _Writes(
            last=_statement(
                dialect,
                select(t.c.position, t.c.recorded_at, t.c.hash)
                .order_by(t.c.position.desc())
                .limit(1),
                literal_binds=True,
            ),
            insert=_statement(
                dialect, insert(t).values({c.name: bindparam(c.name) for c in _INSERT_COLUMNS})
            ),
            by_command=_statement(
                dialect,
                select(*_COLUMNS).where(t.c.command_id == bindparam("key")).order_by(t.c.position),
            ),
            seal=_statement(dialect, select(seal_table.c.position, seal_table.c.hash)),
            adopted=_statement(
                dialect,
                select(adoption_table.c.hash).where(
                    adoption_table.c.position == bindparam("position")
                ),
            ),
            to_db=at_type.bind_processor(dialect) or (lambda value: value),
            from_db=at_type.result_processor(dialect, None) or (lambda value: value),
        )
    return found


def _by_command(conn: Any, dialect: Dialect, key: str) -> tuple[StoredEvent, ...]:
    """The events of command ``key`` on the driver connection ``conn``, in order."""
    w = _writes(dialect)
    cursor = conn.cursor()
    try:
        cursor.execute(w.by_command.sql, w.by_command.params({"key": key}))
        rows = cursor.fetchall()
    finally:
        cursor.close()
    return tuple(decode(r, w.from_db) for r in rows)


def _chain_hash_at(cursor: Any, w: _Writes, head: int) -> str:
    """The chain's value at ``head`` when that row carries no stored hash.

    The last row written before the chain existed has the seal's value. After
    the seal, only a row an operator adopted has one (events.chain): appending
    after any other unhashed row would chain over a row nothing vouches for,
    perhaps a forgery, and make it look covered.
    """
    cursor.execute(w.seal.sql, w.seal.params({}))
    found = cursor.fetchone()
    anchor, value = (int(found[0]), str(found[1])) if found is not None else (0, GENESIS)
    if anchor >= head:
        return value
    cursor.execute(w.adopted.sql, w.adopted.params({"position": head}))
    adopted = cursor.fetchone()
    if adopted is not None and adopted[0] is not None:
        return str(adopted[0])
    raise UnvouchedRow(head, anchor)


class SqlLog:
    """The log over one database (a ``Log``). Thread-safe as far as its engine's pool is.

    Open one with ``open_log`` (events.open), which picks the back end's subclass;
    each back end says how a write section takes the log's lock (``writing``).
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

    def read_for_replay(self, after: int = 0, until: int | None = None) -> Iterator[ReplayEvent]:
        """As ``read``, only what replay reads of each event (events.rows.ReplayEvent):
        the lean read that start-up replays the whole log with."""
        last = after
        end = (1 << 62) if until is None else until
        while True:
            with self.engine.connect() as conn:
                events = fetch_replay_rows(conn, last, end)
            yield from events
            if len(events) < READ_BATCH:
                return
            last = events[-1].position

    def position_at(self, when: datetime) -> int:
        query = select(func.coalesce(func.max(t.c.position), 0)).where(t.c.recorded_at <= when)
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def by_command(self, key: str) -> tuple[StoredEvent, ...]:
        with self.driver() as conn:
            return _by_command(conn, self.engine.dialect, key)

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

    def writing(self) -> AbstractContextManager[SqlLockedLog]:
        """The log with its write lock held, for one transaction (``Log.writing``): how
        the lock is taken is the back end's (events.sqlite_log, events.postgres_log)."""
        raise NotImplementedError

    @contextmanager
    def driver(self) -> Iterator[Any]:
        """The driver's own connection, from the engine's pool and back to it.

        For the few statements of a command, SQLAlchemy's ``Connection`` (its
        events, its transaction object, a cache key per statement) was a large
        part of the command's CPU. Its error handling is kept: a driver error comes out
        as SQLAlchemy's (``OperationalError`` for a locked or unreachable
        database, which the API and the CLI report as such), and a connection
        the error shows dead is dropped from the pool rather than reused.
        """
        dialect = self.engine.dialect
        raw = self.engine.raw_connection()
        try:
            yield raw.dbapi_connection
        except dialect.loaded_dbapi.Error as exc:
            gone = dialect.is_disconnect(exc, raw.dbapi_connection, None)
            if gone:
                raw.invalidate(exc)
            raise DBAPIError.instance(
                None,
                None,
                exc,
                dialect.loaded_dbapi.Error,
                connection_invalidated=gone,
                dialect=dialect,
            ) from exc
        finally:
            raw.close()


class SqlLockedLog:
    """The log inside a write transaction that holds its lock (``SqlLog.writing``),
    on the driver connection ``conn`` of that transaction."""

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self.conn = conn
        self.dialect = dialect
        self._writes = _writes(dialect)

    def read(self, after: int) -> Iterator[StoredEvent]:
        while True:
            rows, convert = fetch_driver_rows(
                self.conn, self.dialect, EVENT_COLUMNS, until=None, model=None, after=after
            )
            events = [decode(r, convert) for r in rows]
            yield from events
            if len(events) < READ_BATCH:
                return
            after = events[-1].position

    def by_command(self, key: str) -> tuple[StoredEvent, ...]:
        return _by_command(self.conn, self.dialect, key)

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
        if key is not None:
            previous = self.by_command(key)
            if previous:
                return AppendOutcome(previous, already_recorded=True)
        w = self._writes
        cursor = self.conn.cursor()
        try:
            cursor.execute(w.last.sql)
            last = cursor.fetchone()
            head, last_time = (int(last[0]), w.from_db(last[1])) if last else (0, None)
            if expected_head is not None and head != expected_head:
                raise ConcurrencyConflict(expected_head, head)
            prev_hash: str = (
                last[2]
                if last is not None and last[2] is not None
                else _chain_hash_at(cursor, w, head)
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
                w.insert.params(
                    {
                        "position": event.position,
                        "event_id": event.event_id,
                        "command_id": event.command_id,
                        "type": event.type,
                        "schema_version": event.schema_version,
                        "model": event.model,
                        "payload": event.payload,
                        "actor": event.actor,
                        "reason": event.reason,
                        "recorded_at": w.to_db(event.recorded_at),
                        "prev_hash": prev,
                        "hash": value,
                    }
                )
                for event, prev, value in rows
            ]
            if len(params) == 1:
                cursor.execute(w.insert.sql, params[0])
            else:
                cursor.executemany(w.insert.sql, params)
        finally:
            cursor.close()
        return AppendOutcome(tuple(event for event, _, _ in rows), already_recorded=False)
