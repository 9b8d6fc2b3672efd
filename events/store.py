"""The append-only event log in SQL: append (optimistic, idempotent) and read in order.

The log's guarantees, and how each back end keeps them:

- Positions are gapless, start at 1 and follow commit order. A writer assigns
  ``head + 1`` while holding the log's write lock (SQLite: ``BEGIN IMMEDIATE``;
  PostgreSQL: ``LOCK TABLE events IN EXCLUSIVE MODE``, which still lets readers
  read). Because the next writer cannot read the head until the previous one
  has committed, position N+1 never becomes visible before N, and a reader
  tailing with ``position > last`` never skips an event that committed late.
  (A sequence would hand out numbers in start order, not commit order.)
- A command validates and appends under that same lock (``EventStore.writing``),
  so writers queue rather than race. A bare ``append`` is still checked: the
  caller says which head it validated against, and the append is refused with
  ``ConcurrencyConflict`` if the log has moved.
- A command key makes an append idempotent: the same key again returns the
  events first written under it, and appends nothing.
- Each appended row carries its hash in the log's hash chain (events.chain),
  computed under the same lock from the previous row's hash, which the append
  reads together with the head.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
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

from events.chain import GENESIS, ChainRow, Seal, event_hash
from events.db import WRITE
from events.tables import ChainAdoptionRow, ChainSealRow, EventRow
from events.types import NewEvent, StoredEvent

READ_BATCH = 5_000
# How long a PostgreSQL writer waits for the log's lock before giving up with an
# error: long enough for any queue of writers, short enough to not hang forever.
PG_LOCK_TIMEOUT = "30s"
t: Table = EventRow.__table__  # type: ignore[assignment]  # declarative tables are Tables
seal_table: Table = ChainSealRow.__table__  # type: ignore[assignment]
adoption_table: Table = ChainAdoptionRow.__table__  # type: ignore[assignment]


class UnvouchedRow(Exception):
    """The last row of the log has no hash after the chain's seal and nobody adopted it."""

    def __init__(self, position: int, seal: int) -> None:
        super().__init__(
            f"the log's last event, position {position}, carries no hash after the chain's "
            f"seal (position {seal}): it was written outside llmgw, and appending would "
            "chain over it as if it were genuine. Nothing was written. Run `llmgw verify`; "
            "if you know the row is genuine (an older release wrote it during an upgrade), "
            "adopt it: llmgw verify --adopt-unhashed --actor NAME --reason WHY"
        )
        self.position = position


class ConcurrencyConflict(Exception):
    """The log moved past the head a command validated against."""

    def __init__(self, expected: int, actual: int) -> None:
        super().__init__(f"the log is at position {actual}, not {expected}")
        self.expected = expected
        self.actual = actual


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """Which events ``EventStore.history`` returns; every filter given must hold.

    ``model``, ``actor`` and ``type`` match exactly (a model by the name the
    event recorded); ``since`` and ``until`` bound ``recorded_at``, both
    inclusive.
    """

    model: str | None = None
    actor: str | None = None
    type: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    events: tuple[StoredEvent, ...]
    # True when the command key had been used before: nothing was appended now,
    # and ``events`` are the ones the first attempt wrote.
    already_recorded: bool


_COLUMNS = (
    t.c.position,
    t.c.event_id,
    t.c.command_id,
    t.c.type,
    t.c.schema_version,
    t.c.model,
    t.c.payload,
    t.c.actor,
    t.c.reason,
    t.c.recorded_at,
)


_CHAIN_COLUMNS = (*_COLUMNS, t.c.prev_hash, t.c.hash)


def _to_event(row: Sequence[Any]) -> StoredEvent:
    # Columns are selected in StoredEvent's field order (_COLUMNS).
    position, event_id, command_id, type_, version, model, payload, actor, reason, at = row
    return StoredEvent(
        position, event_id, command_id, type_, version, model, payload, actor, reason, at
    )


@cache
def _read_query(until: bool, model: bool) -> Select[Any]:
    """The select ``read`` runs, one per shape; every value is bound, the batch size too
    (``READ_BATCH`` is read at each call, so nothing cached here goes stale)."""
    query = select(*_COLUMNS).where(t.c.position > bindparam("after"))
    if until:
        query = query.where(t.c.position <= bindparam("until"))
    if model:
        query = query.where(t.c.model == bindparam("model"))
    return query.order_by(t.c.position).limit(bindparam("batch", type_=Integer()))


_CompiledRead = tuple[str, tuple[str, ...] | None, dict[str, Any], Any]
_COMPILED_READS: dict[tuple[str, str, str, bool, bool], _CompiledRead] = {}


def _compiled_read(dialect: Dialect, until: bool, model: bool) -> _CompiledRead:
    """SQL text, positional order of the binds, their fixed values, and the time converter."""
    key = (dialect.name, dialect.driver, dialect.paramstyle, until, model)
    found = _COMPILED_READS.get(key)
    if found is None:
        compiled = _read_query(until, model).compile(dialect=dialect)
        order = tuple(compiled.positiontup or ()) if dialect.positional else None
        at_type = t.c.recorded_at.type.dialect_impl(dialect)
        convert = at_type.result_processor(dialect, None) or (lambda value: value)
        found = _COMPILED_READS[key] = (compiled.string, order, dict(compiled.params), convert)
    return found


def _fetch_events(
    conn: Connection, until: int | None, model: str | None, after: int
) -> list[StoredEvent]:
    """One batch of ``read``, fetched with the driver's own cursor.

    Start-up reads the whole log, and SQLAlchemy's result rows (a ``Row`` per
    row, a type processor per value) cost more than everything else about
    reading it. On SQLite and PostgreSQL the rows are fetched as plain tuples
    instead, by SQL compiled once per shape of query; only ``recorded_at``
    needs converting, and it goes through its column type's own result
    processor (``UTCDateTime``), so the events are exactly those
    ``conn.execute(query).all()`` would give.
    """
    dialect = conn.dialect
    values = {"after": after, "until": until, "model": model, "batch": READ_BATCH}
    if dialect.name not in ("sqlite", "postgresql"):
        query = _read_query(until is not None, model is not None)
        return [_to_event(row) for row in conn.execute(query, values).all()]
    sql, order, fixed, convert = _compiled_read(dialect, until is not None, model is not None)
    bound = {**fixed, **values}
    params: Any = bound if order is None else tuple(bound[name] for name in order)
    cursor = conn.connection.cursor()
    try:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    finally:
        cursor.close()
    return [_decode(r, convert) for r in rows]


def _decode(r: Sequence[Any], convert: Any) -> StoredEvent:
    """One row as a StoredEvent; a row whose columns are not their types (SQLite keeps
    whatever it is given) is still returned, marked unreadable, for replay to skip
    and name: one bad row must not stop a read of the whole log."""
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


_INSERT_COLUMNS = (*_COLUMNS, t.c.prev_hash, t.c.hash)
_CompiledAppend = tuple[str, str, tuple[str, ...] | None, Any, Any]
_COMPILED_APPENDS: dict[tuple[str, str, str], _CompiledAppend] = {}


def _compiled_append(dialect: Dialect) -> _CompiledAppend:
    """The two statements of an append, compiled once per dialect: the last row
    (position, time, hash) and the insert, with the time's bind and result converters.

    An append is short and frequent; SQLAlchemy's per-statement work (cache
    keys, compiled-parameter processing, result rows) cost as much as the
    commit itself. The statements are the same ones, only executed on the
    driver's cursor.
    """
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


def _to_chain_row(row: Sequence[Any]) -> ChainRow:
    *event, prev_hash, hash_ = row
    return ChainRow(*_hash_input(event), prev_hash, hash_)


def _hash_row(prev_hash: str, row: Sequence[Any]) -> str:
    """The chain's value at a row of _COLUMNS, given the value before it."""
    return event_hash(prev_hash, *_hash_input(row))


def _hash_input(
    row: Sequence[Any],
) -> tuple[int, str, str, str, int, str | None, str, str, str, datetime]:
    position, event_id, command_id, type_, version, model, payload, actor, reason, at = row
    return position, event_id, command_id, type_, version, model, payload, actor, reason, at


class EventStore:
    """The log over one database. Thread-safe as far as its engine's pool is."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- reading ----------------------------------------------------------

    def head(self) -> int:
        """The last position written, 0 for an empty log."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.coalesce(func.max(t.c.position), 0))).scalar_one())

    def read(
        self, after: int = 0, until: int | None = None, *, model: str | None = None
    ) -> Iterator[StoredEvent]:
        """Events with ``after < position <= until``, in order, streamed in batches.

        ``model`` keeps only the events about that model (as recorded, by name).

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
        """The last position recorded at or before ``when`` (0 if none).

        Recorded times never go backwards along the log (see ``append``), so
        this is a prefix of the log, which is what "the catalog at a time" means.
        """
        query = select(func.coalesce(func.max(t.c.position), 0)).where(t.c.recorded_at <= when)
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def history(self, query: HistoryQuery, after: int = 0) -> Iterator[StoredEvent]:
        """The events matching ``query``, in log order, filtered in SQL and streamed in batches."""
        conditions = [t.c.position > after]
        if query.model is not None:
            conditions.append(t.c.model == query.model)
        if query.actor is not None:
            conditions.append(t.c.actor == query.actor)
        if query.type is not None:
            conditions.append(t.c.type == query.type)
        if query.since is not None:
            conditions.append(t.c.recorded_at >= query.since)
        if query.until is not None:
            conditions.append(t.c.recorded_at <= query.until)
        while True:
            select_batch = (
                select(*_COLUMNS).where(*conditions).order_by(t.c.position).limit(READ_BATCH)
            )
            with self.engine.connect() as conn:
                rows = conn.execute(select_batch).all()
            for row in rows:
                yield _to_event(row)
            if len(rows) < READ_BATCH:
                return
            conditions[0] = t.c.position > rows[-1][0]

    def read_chain(self, after: int = 0) -> Iterator[ChainRow]:
        """Every event with its chain columns, in order, for ``llmgw verify``."""
        last = after
        while True:
            query = (
                select(*_CHAIN_COLUMNS)
                .where(t.c.position > last)
                .order_by(t.c.position)
                .limit(READ_BATCH)
            )
            with self.engine.connect() as conn:
                rows = conn.execute(query).all()
            for row in rows:
                yield _to_chain_row(row)
            if len(rows) < READ_BATCH:
                return
            last = rows[-1][0]

    def seal(self) -> Seal | None:
        """Where the hash chain starts (see events.chain); None if the row is missing."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(seal_table.c.position, seal_table.c.hash, seal_table.c.sealed_at)
            ).first()
        return None if row is None else Seal(int(row[0]), row[1], row[2])

    def hash_at(self, position: int) -> str | None:
        """The stored chain hash of one event (None: no such event, or written before the chain)."""
        with self.engine.connect() as conn:
            return conn.execute(select(t.c.hash).where(t.c.position == position)).scalar()

    def by_command(self, key: str) -> tuple[StoredEvent, ...]:
        with self.engine.connect() as conn:
            return self._by_command(conn, key)

    @staticmethod
    def _by_command(conn: Connection, key: str) -> tuple[StoredEvent, ...]:
        rows = conn.execute(
            select(*_COLUMNS).where(t.c.command_id == key).order_by(t.c.position)
        ).all()
        return tuple(_to_event(r) for r in rows)

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
        """Append ``events`` atomically, all or none.

        ``expected_head`` is the position the caller validated against; ``None``
        appends unconditionally (for events that need no validation). ``key``
        is the command's idempotency key.
        """
        with self.writing() as log:
            return log.append(
                events, expected_head=expected_head, actor=actor, reason=reason, key=key, now=now
            )

    @contextmanager
    def writing(self) -> Iterator[LockedLog]:
        """The log with its write lock held, for one transaction: commits on exit.

        A command takes the lock *before* it validates against the head, reads
        what others appended since, validates and appends: a writer waits its
        turn instead of validating against a head that moves under it and
        losing the race. SQLite waits up to its busy timeout (events.db);
        PostgreSQL up to ``PG_LOCK_TIMEOUT``.
        """
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{PG_LOCK_TIMEOUT}'")
                conn.exec_driver_sql("LOCK TABLE events IN EXCLUSIVE MODE")
            yield LockedLog(conn)


class LockedLog:
    """The log inside a write transaction that holds its lock (``EventStore.writing``)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def read(self, after: int) -> Iterator[StoredEvent]:
        """Every event after ``after``, as committed before the lock was taken."""
        while True:
            events = _fetch_events(self.conn, None, None, after)
            yield from events
            if len(events) < READ_BATCH:
                return
            after = events[-1].position

    def by_command(self, key: str) -> tuple[StoredEvent, ...]:
        return EventStore._by_command(self.conn, key)

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
        """As ``EventStore.append``, inside this transaction."""
        if not events:
            raise ValueError("nothing to append")
        conn = self.conn
        command_id = key or uuid.uuid4().hex
        if key is not None:
            previous = EventStore._by_command(conn, key)
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
                last[2] if last is not None and last[2] is not None else _chain_hash_at(conn, head)
            )
            recorded_at = now or datetime.now(UTC)
            # Clocks of different replicas disagree a little; clamping keeps
            # time order equal to log order, so "the catalog at 12:00" is a
            # prefix of the log.
            if last_time is not None and recorded_at < last_time:
                recorded_at = last_time
            rows: list[dict[str, Any]] = [
                {
                    "position": head + i,
                    "event_id": _event_id(key, i) if key else uuid.uuid4().hex,
                    "command_id": command_id,
                    "type": e.type,
                    "schema_version": e.schema_version,
                    "model": e.model,
                    "payload": e.payload,
                    "actor": actor,
                    "reason": reason,
                    "recorded_at": recorded_at,
                }
                for i, e in enumerate(events, start=1)
            ]
            for row in rows:
                row["prev_hash"] = prev_hash
                prev_hash = _hash_row(prev_hash, [row[c.name] for c in _COLUMNS])
                row["hash"] = prev_hash
            params = [{**row, "recorded_at": to_db(row["recorded_at"])} for row in rows]
            if order is not None:
                cursor.executemany(insert_sql, [tuple(p[n] for n in order) for p in params])
            else:
                cursor.executemany(insert_sql, params)
        finally:
            cursor.close()
        return AppendOutcome(
            tuple(_to_event([row[c.name] for c in _COLUMNS]) for row in rows),
            already_recorded=False,
        )


def _chain_hash_at(conn: Connection, head: int) -> str:
    """The chain's value at ``head`` when that row carries no stored hash.

    The last row written before the chain existed has the seal's value. After
    the seal, only a row an operator adopted has one (events.chain): appending
    after any other unhashed row would chain over a row nothing vouches for,
    perhaps a forgery, and make it look covered.
    """
    seal = conn.execute(select(seal_table.c.position, seal_table.c.hash)).first()
    anchor, value = (int(seal[0]), str(seal[1])) if seal is not None else (0, GENESIS)
    if anchor >= head:
        return value
    adopted = conn.execute(
        select(adoption_table.c.hash).where(adoption_table.c.position == head)
    ).scalar()
    if adopted is not None:
        return str(adopted)
    raise UnvouchedRow(head, anchor)


def _event_id(key: str, index: int) -> str:
    """The first event of a keyed command carries the key itself as its id."""
    return key if index == 1 else f"{key}#{index}"
