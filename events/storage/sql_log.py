"""The event log in SQL: what SQLite and PostgreSQL share (``sqlite_log``, ``postgres_log``).

Reads and appends run on the driver's own cursor, with SQL compiled once per
dialect and shape of query: start-up reads the whole log, and SQLAlchemy's
per-row and per-statement work (a ``Row`` per row, a type processor per value,
cache keys) cost more than everything else about reading it, and as much as the
commit itself for an append. The statements are the same ones; only
``recorded_at`` is converted, through its column type's own processors
(``UTCDateTime``), so the events are exactly those ``conn.execute(query).all()``
would give (tests/integration/test_store_read_path.py).

What differs between the back ends is how a write section begins, takes the
log's lock and ends (``SqlLog.writing``: events.storage.sqlite_log on the driver's
connection, events.storage.postgres_log inside SQLAlchemy's transaction); the
statements of a section (``SqlLockedLog``) are here, compiled once per dialect
(``_writes``). The log's guarantees are events.storage.log's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Dialect,
    Engine,
    Integer,
    bindparam,
    func,
    insert,
    select,
)
from sqlalchemy.exc import DBAPIError, StatementError

from events.core.chain import GENESIS
from events.core.rows import EVENT_COLUMNS, ReplayEvent, decode
from events.core.types import StoredEvent
from events.storage import sql_reads
from events.storage.chain_rows import adoption_table, seal_table
from events.storage.log import ChainedRow, SectionedLog, UnvouchedRow, WriteSection
from events.storage.sql_reads import (
    _COLUMNS,
    _INSERT_COLUMNS,
    Convert,
    _fetch_events,
    fetch_driver_rows,
    fetch_replay_rows,
    recorded_at_from_db,
    t,
)

# -- the write side: statements compiled once per dialect, run on the driver's cursor --

_INSERT_NAMES = tuple(c.name for c in _INSERT_COLUMNS)


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

    def row(self, values: tuple[Any, ...]) -> Any:
        """``params`` of the insert given a value for each of its binds, in
        ``_INSERT_NAMES`` order: the tuple itself when the driver's binds are positional
        in that order (SQLite's), since every bind is given and nothing fixed is left."""
        if self.order == _INSERT_NAMES:
            return values
        return self.params(dict(zip(_INSERT_NAMES, values, strict=True)))


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
# The position of a keyed command's first event, whose id is the key (events.storage.log).
_first_event_of_key = select(t.c.position).where(t.c.event_id == bindparam("key")).scalar_subquery()


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
                select(*_COLUMNS)
                .where(
                    t.c.position >= _first_event_of_key,
                    t.c.position >= bindparam("start"),
                )
                .order_by(t.c.position)
                .limit(bindparam("batch", type_=Integer())),
            ),
            seal=_statement(dialect, select(seal_table.c.position, seal_table.c.hash)),
            adopted=_statement(
                dialect,
                select(adoption_table.c.hash).where(
                    adoption_table.c.position == bindparam("position")
                ),
            ),
            to_db=_to_db(dialect, at_type.bind_processor(dialect) or (lambda value: value)),
            from_db=_from_db(dialect, recorded_at_from_db(dialect)),
        )
    return found


def _to_db(dialect: Dialect, processor: Convert) -> Convert:
    """``recorded_at`` as the driver takes it: the column type's processor, or on SQLite,
    for a UTC time (every time an append records), the same text written directly
    (``YYYY-MM-DD HH:MM:SS.ffffff``; the processor's ``%`` formatting of a dict of
    fields cost more than hashing the event). tests/unit/events/test_store_times.py
    holds the two equal."""
    if dialect.name != "sqlite":
        return processor

    def to_sqlite(value: Any) -> Any:
        if type(value) is datetime and value.tzinfo is UTC:
            return value.replace(tzinfo=None).isoformat(" ", "microseconds")
        return processor(value)

    return to_sqlite


def _from_db(dialect: Dialect, processor: Convert) -> Convert:
    """``recorded_at`` as stored, as ``UTCDateTime`` reads it: on SQLite, a text value
    parsed as its processor does (``datetime.fromisoformat``, then UTC), in one call
    rather than three; anything else through the processor itself."""
    if dialect.name != "sqlite":
        return processor

    def from_sqlite(value: Any) -> Any:
        if type(value) is not str:
            return processor(value)
        parsed = datetime.fromisoformat(value)
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)

    return from_sqlite


# How many rows a key's lookup reads at a time: a command is one event, or a few for a
# list add; a longer one is read on in further batches.
_KEY_BATCH = 16


def _by_command(conn: Any, dialect: Dialect, key: str) -> tuple[StoredEvent, ...]:
    """The events of command ``key`` on the driver connection ``conn``, in order.

    Found through the unique index on ``event_id``, not one on ``command_id``: the
    first event of a keyed command carries the key itself as its id (events.storage.log),
    and the command's events are consecutive (one transaction under the write
    lock), so they are the rows from that one on while ``command_id`` is the key.
    An index on ``command_id`` would say nothing more, and every append paid for
    keeping it (one more b-tree page in each commit, BENCHMARKS.md). A row whose
    id is the key but whose command is another is not a command of this key:
    nothing is found, as a lookup by ``command_id`` would not have found it either.
    """
    w = _writes(dialect)
    found: list[StoredEvent] = []
    start = 0
    cursor = conn.cursor()
    try:
        while True:
            params = {"key": key, "start": start, "batch": _KEY_BATCH}
            cursor.execute(w.by_command.sql, w.by_command.params(params))
            rows = cursor.fetchall()
            for row in rows:
                event = decode(row, w.from_db)
                if event.command_id != key:
                    return tuple(found)
                found.append(event)
            if len(rows) < _KEY_BATCH:
                return tuple(found)
            start = found[-1].position + 1
    finally:
        cursor.close()


def _chain_hash_at(cursor: Any, w: _Writes, head: int) -> str:
    """The chain's value at ``head`` when that row carries no stored hash.

    The last row written before the chain existed has the seal's value. After
    the seal, only a row an operator adopted has one (events.core.chain): appending
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


class SqlLog(SectionedLog):
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
            if len(events) < sql_reads.READ_BATCH:
                return
            last = events[-1].position

    def read_for_replay(self, after: int = 0, until: int | None = None) -> Iterator[ReplayEvent]:
        """As ``read``, only what replay reads of each event (events.core.rows.ReplayEvent):
        the lean read that start-up replays the whole log with."""
        last = after
        end = (1 << 62) if until is None else until
        while True:
            with self.engine.connect() as conn:
                events = fetch_replay_rows(conn, last, end)
            yield from events
            if len(events) < sql_reads.READ_BATCH:
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

    def writing(self) -> AbstractContextManager[SqlLockedLog]:
        """The log with its write lock held, for one transaction (``Log.writing``): how
        the lock is taken is the back end's (events.storage.sqlite_log,
        events.storage.postgres_log)."""
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
            raise driver_error(dialect, exc, gone) from exc
        finally:
            raw.close()


def driver_error(dialect: Dialect, exc: Exception, gone: bool) -> StatementError:
    """A driver's error as SQLAlchemy raises it (``OperationalError`` and the rest)."""
    return DBAPIError.instance(
        None,
        None,
        exc,
        dialect.loaded_dbapi.Error,
        connection_invalidated=gone,
        dialect=dialect,
    )


class SqlLockedLog(WriteSection):
    """The log inside a write transaction that holds its lock (``SqlLog.writing``),
    on the driver connection ``conn`` of that transaction."""

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self.conn = conn
        self.dialect = dialect
        self._writes = _writes(dialect)
        # The log's last row (position, recorded_at as the driver gives it, hash), None
        # when the log is empty: read once per section, since with the lock held only
        # this section's own appends move it. A command asks for it twice (does the
        # log hold anything it has not applied; then the head and hash to chain on),
        # and most of the time the first answer is "nothing new": one statement, not two.
        self._last: tuple[Any, ...] | None = None
        self._last_read = False

    def _last_row(self) -> tuple[Any, ...] | None:
        if not self._last_read:
            cursor = self.conn.cursor()
            try:
                cursor.execute(self._writes.last.sql)
                self._last = cursor.fetchone()
            finally:
                cursor.close()
            self._last_read = True
        return self._last

    def read(self, after: int) -> Iterator[StoredEvent]:
        last = self._last_row()
        if last is None or int(last[0]) <= after:  # positions are gapless: nothing after
            return
        while True:
            rows, convert = fetch_driver_rows(
                self.conn, self.dialect, EVENT_COLUMNS, until=None, model=None, after=after
            )
            events = [decode(r, convert) for r in rows]
            yield from events
            if len(events) < sql_reads.READ_BATCH:
                return
            after = events[-1].position

    def by_command(self, key: str) -> tuple[StoredEvent, ...]:
        return _by_command(self.conn, self.dialect, key)

    def execute(self, stmt: Any) -> list[tuple[Any, ...]]:
        """Run one more SQLAlchemy Core statement in this section's transaction (a table
        whose change must commit with the events appended here, e.g. the tokens'); its
        rows, if it returns any. Compiled each time: for the rare writes beside the log,
        not the log's own. Values are bound through their column types (a ``UTCDateTime``
        as that type writes it) and come back as the driver gives them."""
        compiled = stmt.compile(dialect=self.dialect)
        processors = compiled._bind_processors
        values = {
            name: processors[name](value) if name in processors else value
            for name, value in compiled.construct_params().items()
        }
        params: Any = (
            tuple(values[name] for name in compiled.positiontup or ())
            if self.dialect.positional
            else values
        )
        cursor = self.conn.cursor()
        try:
            cursor.execute(compiled.string, params)
            return [tuple(r) for r in cursor.fetchall()] if cursor.description else []
        finally:
            cursor.close()

    def tail(self) -> tuple[int, datetime | None]:
        last = self._last_row()
        return (int(last[0]), self._writes.from_db(last[1])) if last else (0, None)

    def head_hash(self, head: int) -> str:
        last = self._last_row()
        if last is not None and last[2] is not None:
            return str(last[2])
        cursor = self.conn.cursor()
        try:
            return _chain_hash_at(cursor, self._writes, head)
        finally:
            cursor.close()

    def write(self, rows: list[ChainedRow]) -> None:
        w = self._writes
        at = w.to_db(rows[0][0].recorded_at)  # one time for the whole command
        params = [
            w.insert.row(
                (
                    event.position,
                    event.event_id,
                    event.command_id,
                    event.type,
                    event.schema_version,
                    event.model,
                    event.payload,
                    event.actor,
                    event.reason,
                    at,
                    prev,
                    value,
                )
            )
            for event, prev, value in rows
        ]
        cursor = self.conn.cursor()
        try:
            if len(params) == 1:
                cursor.execute(w.insert.sql, params[0])
            else:
                cursor.executemany(w.insert.sql, params)
        finally:
            cursor.close()
        self._last = (rows[-1][0].position, at, rows[-1][2])
