"""The append-only event log in SQL: append (optimistic, idempotent) and read in order.

The log's guarantees, and how each back end keeps them:

- Positions are gapless, start at 1 and follow commit order. A writer assigns
  ``head + 1`` while holding the log's write lock (SQLite: ``BEGIN IMMEDIATE``;
  PostgreSQL: ``LOCK TABLE events IN EXCLUSIVE MODE``, which still lets readers
  read). Because the next writer cannot read the head until the previous one
  has committed, position N+1 never becomes visible before N, and a reader
  tailing with ``position > last`` never skips an event that committed late.
  (A sequence would hand out numbers in start order, not commit order.)
- Append is optimistic: the caller says which head it validated against, and
  the append is refused with ``ConcurrencyConflict`` if the log has moved.
- A command key makes an append idempotent: the same key again returns the
  events first written under it, and appends nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, Table, func, insert, select

from events.db import WRITE
from events.tables import EventRow
from events.types import NewEvent, StoredEvent

READ_BATCH = 5_000
t: Table = EventRow.__table__  # type: ignore[assignment]  # declarative tables are Tables


class ConcurrencyConflict(Exception):
    """The log moved past the head a command validated against."""

    def __init__(self, expected: int, actual: int) -> None:
        super().__init__(f"the log is at position {actual}, not {expected}")
        self.expected = expected
        self.actual = actual


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


def _to_event(row: Sequence[Any]) -> StoredEvent:
    # Columns are selected in StoredEvent's field order (_COLUMNS).
    position, event_id, command_id, type_, version, model, payload, actor, reason, at = row
    return StoredEvent(
        position, event_id, command_id, type_, version, model, payload, actor, reason, at
    )


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
            query = select(*_COLUMNS).where(t.c.position > last)
            if until is not None:
                query = query.where(t.c.position <= until)
            if model is not None:
                query = query.where(t.c.model == model)
            query = query.order_by(t.c.position).limit(READ_BATCH)
            with self.engine.connect() as conn:
                rows = conn.execute(query).all()
            for row in rows:
                yield _to_event(row)
            if len(rows) < READ_BATCH:
                return
            last = rows[-1][0]

    def position_at(self, when: datetime) -> int:
        """The last position recorded at or before ``when`` (0 if none).

        Recorded times never go backwards along the log (see ``append``), so
        this is a prefix of the log, which is what "the catalog at a time" means.
        """
        query = select(func.coalesce(func.max(t.c.position), 0)).where(t.c.recorded_at <= when)
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

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
        if not events:
            raise ValueError("nothing to append")
        command_id = key or uuid.uuid4().hex
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql("LOCK TABLE events IN EXCLUSIVE MODE")
            if key is not None:
                previous = self._by_command(conn, key)
                if previous:
                    return AppendOutcome(previous, already_recorded=True)
            last = conn.execute(
                select(t.c.position, t.c.recorded_at).order_by(t.c.position.desc()).limit(1)
            ).first()
            head, last_time = (int(last[0]), last[1]) if last else (0, None)
            if expected_head is not None and head != expected_head:
                raise ConcurrencyConflict(expected_head, head)
            recorded_at = now or datetime.now(UTC)
            # Clocks of different replicas disagree a little; clamping keeps
            # time order equal to log order, so "the catalog at 12:00" is a
            # prefix of the log.
            if last_time is not None and recorded_at < last_time:
                recorded_at = last_time
            rows = [
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
            conn.execute(insert(t), rows)
        return AppendOutcome(
            tuple(StoredEvent(**row) for row in rows),  # type: ignore[arg-type]
            already_recorded=False,
        )


def _event_id(key: str, index: int) -> str:
    """The first event of a keyed command carries the key itself as its id."""
    return key if index == 1 else f"{key}#{index}"
