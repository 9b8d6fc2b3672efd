"""The event log as the rest of the code sees it: a small protocol, and what every back end shares.

The log's guarantees, which every implementation keeps (the contract suite,
tests/integration/test_store_contract.py, runs the same tests against each):

- Positions are gapless, start at 1 and follow commit order. A writer assigns
  ``head + 1`` while holding the log's write lock, so position N+1 never
  becomes visible before N and a reader tailing with ``position > last`` never
  skips an event that committed late. (A sequence would hand out numbers in
  start order, not commit order.)
- A command validates and appends under that same lock (``Log.writing``), so
  writers queue rather than race. A bare ``append`` is still checked: the
  caller says which head it validated against, and the append is refused with
  ``ConcurrencyConflict`` if the log has moved.
- A command key makes an append idempotent: the same key again returns the
  events first written under it, and appends nothing.
- Each appended row carries its hash in the log's hash chain (events.core.chain),
  computed under the same lock from the previous row's hash.
- Recorded times never go backwards along the log (``position_at`` relies on it).

Implementations, one module each: events.storage.sqlite_log, events.storage.postgres_log (both
over the shared SQL in events.storage.sql_log) and events.storage.memory_log (for unit tests of
the commands). Pure: nothing here touches a database.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, Required, TypedDict, Unpack

from events.core.chain import event_hash
from events.core.rows import ReplayEvent
from events.core.types import NewEvent, StoredEvent

# Appended rows as (event, prev_hash, hash): what a back end writes.
ChainedRow = tuple[StoredEvent, str, str]


class ConcurrencyConflict(Exception):
    """The log moved past the head a command validated against."""

    def __init__(self, expected: int, actual: int) -> None:
        super().__init__(f"the log is at position {actual}, not {expected}")
        self.expected = expected
        self.actual = actual


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


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    events: tuple[StoredEvent, ...]
    # True when the command key had been used before: nothing was appended now,
    # and ``events`` are the ones the first attempt wrote.
    already_recorded: bool


class AppendOptions(TypedDict, total=False):
    """``Log.append``'s keyword arguments, for the code that passes them on as they are."""

    expected_head: Required[int | None]
    actor: str
    reason: str
    key: str | None
    now: datetime | None


class LockedLog(Protocol):
    """The log inside a write transaction that holds its lock (``Log.writing``)."""

    def read(self, after: int) -> Iterator[StoredEvent]:
        """Every event after ``after``, as committed before the lock was taken."""
        ...

    def by_command(self, key: str) -> tuple[StoredEvent, ...]: ...

    def append(self, events: Sequence[NewEvent], **options: Unpack[AppendOptions]) -> AppendOutcome:
        """As ``Log.append``, inside this transaction."""
        ...


class Log(Protocol):
    """An append-only event log (see the guarantees above)."""

    def head(self) -> int:
        """The last position written, 0 for an empty log."""
        ...

    def read(
        self, after: int = 0, until: int | None = None, *, model: str | None = None
    ) -> Iterator[StoredEvent]:
        """Events with ``after < position <= until``, in order; ``model`` keeps only the
        events about that model (as recorded, by name)."""
        ...

    def read_for_replay(
        self, after: int = 0, until: int | None = None
    ) -> Iterator[ReplayEvent | StoredEvent]:
        """``read``'s events as replay needs them, nothing more: a back end may read less
        of each row (events.core.rows.ReplayEvent), never judge a row differently."""
        ...

    def position_at(self, when: datetime) -> int:
        """The last position recorded at or before ``when`` (0 if none): a prefix of the
        log, since recorded times never go backwards."""
        ...

    def by_command(self, key: str) -> tuple[StoredEvent, ...]:
        """The events appended under command key ``key``, in order (none: never used)."""
        ...

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
        ...

    def writing(self) -> AbstractContextManager[LockedLog]:
        """The log with its write lock held, for one transaction: commits on exit.

        A command takes the lock *before* it validates against the head, reads
        what others appended since, validates and appends: a writer waits its
        turn instead of validating against a head that moves under it.
        """
        ...


class SectionedLog:
    """What every back end's ``Log`` shares: a bare ``append`` is a write section of its own."""

    def writing(self) -> AbstractContextManager[LockedLog]:
        raise NotImplementedError

    def append(self, events: Sequence[NewEvent], **options: Unpack[AppendOptions]) -> AppendOutcome:
        with self.writing() as section:
            return section.append(events, **options)


class WriteSection:
    """What every back end's write section (a ``LockedLog``) shares: an append's checks,
    its idempotency by command key, its fencing against ``expected_head`` and its rows
    (``chained_rows``). A back end says where the log ends and writes the rows."""

    def by_command(self, key: str) -> tuple[StoredEvent, ...]:
        raise NotImplementedError

    def tail(self) -> tuple[int, datetime | None]:
        """The log's head as this section sees it, and the head row's recorded time."""
        raise NotImplementedError

    def head_hash(self, head: int) -> str:
        """The hash the next row chains on (the head row's, or the chain's start)."""
        raise NotImplementedError

    def write(self, rows: list[ChainedRow]) -> None:
        """Write the rows in this section: visible to others when it commits."""
        raise NotImplementedError

    def append(self, events: Sequence[NewEvent], **options: Unpack[AppendOptions]) -> AppendOutcome:
        if not events:
            raise ValueError("nothing to append")
        key = options.get("key")
        if key is not None:
            previous = self.by_command(key)
            if previous:
                return AppendOutcome(previous, already_recorded=True)
        head, last_time = self.tail()
        expected = options["expected_head"]
        if expected is not None and head != expected:
            raise ConcurrencyConflict(expected, head)
        rows = chained_rows(
            events,
            head=head,
            prev_hash=self.head_hash(head),
            last_time=last_time,
            actor=options.get("actor", ""),
            reason=options.get("reason", ""),
            key=key,
            now=options.get("now"),
        )
        self.write(rows)
        return AppendOutcome(tuple(event for event, _, _ in rows), already_recorded=False)


def chained_rows(
    events: Sequence[NewEvent],
    *,
    head: int,
    prev_hash: str,
    last_time: datetime | None,
    actor: str,
    reason: str,
    key: str | None,
    now: datetime | None,
) -> list[ChainedRow]:
    """The rows an append writes after ``head``: positions, ids, one time, and hashes.

    The same for every back end, so that a log copied from one to another
    verifies unchanged.
    """
    if not events:
        raise ValueError("nothing to append")
    # Without a key: a random id for the command and one per event, from one read of
    # the system's randomness (a system call each was a tenth of building the rows).
    ids = [] if key else _uuid4_hexes(len(events) + 1)
    command_id = key or ids[-1]
    recorded_at = now or datetime.now(UTC)
    # Clocks of different replicas disagree a little; clamping keeps time order
    # equal to log order, so "the catalog at 12:00" is a prefix of the log.
    if last_time is not None and recorded_at < last_time:
        recorded_at = last_time
    rows: list[ChainedRow] = []
    for i, e in enumerate(events, start=1):
        event = StoredEvent(
            head + i,
            _event_id(key, i) if key else ids[i - 1],
            command_id,
            e.type,
            e.schema_version,
            e.model,
            e.payload,
            actor,
            reason,
            recorded_at,
        )
        value = event_hash(
            prev_hash,
            event.position,
            event.event_id,
            event.command_id,
            event.type,
            event.schema_version,
            event.model,
            event.payload,
            event.actor,
            event.reason,
            event.recorded_at,
        )
        rows.append((event, prev_hash, value))
        prev_hash = value
    return rows


def _uuid4_hexes(count: int) -> list[str]:
    """``count`` values of ``uuid.uuid4().hex``, without building a ``UUID`` each."""
    raw = bytearray(os.urandom(16 * count))
    out = []
    for start in range(0, 16 * count, 16):
        raw[start + 6] = (raw[start + 6] & 0x0F) | 0x40  # version 4
        raw[start + 8] = (raw[start + 8] & 0x3F) | 0x80  # the RFC 4122 variant
        out.append(raw[start : start + 16].hex())
    return out


def _event_id(key: str, index: int) -> str:
    """The first event of a keyed command carries the key itself as its id."""
    return key if index == 1 else f"{key}#{index}"
