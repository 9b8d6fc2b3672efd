"""The event log in memory: the contract of events.log with nothing stored.

For unit tests of what runs against a log (the commands, the read model):
the same positions, ids, times, hashes, idempotency and head checks as the SQL
logs, checked by the same contract suite. A lock held for a ``writing``
section makes writers queue, as the databases' locks do; nothing is written
unless the section ends without an exception.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

from events.chain import GENESIS
from events.log import AppendOutcome, ConcurrencyConflict, chained_rows
from events.rows import ReplayEvent
from events.types import NewEvent, StoredEvent


class MemoryLog:
    """A ``Log`` held in a list; thread-safe."""

    def __init__(self) -> None:
        self._events: list[StoredEvent] = []
        self._hash = GENESIS
        self._by_key: dict[str, tuple[StoredEvent, ...]] = {}
        self._lock = threading.RLock()

    def head(self) -> int:
        return len(self._events)

    def read(
        self, after: int = 0, until: int | None = None, *, model: str | None = None
    ) -> Iterator[StoredEvent]:
        # Positions are 1..head, so the slice is the range; a copy, so that an
        # append while the caller iterates is not seen half-way.
        end = len(self._events) if until is None else max(until, 0)
        chosen = self._events[max(after, 0) : end]
        return iter([e for e in chosen if model is None or e.model == model])

    def read_for_replay(
        self, after: int = 0, until: int | None = None
    ) -> Iterator[ReplayEvent | StoredEvent]:
        return self.read(after, until)

    def position_at(self, when: datetime) -> int:
        times = [e.recorded_at for e in self._events]
        return bisect.bisect_right(times, when)

    def by_command(self, key: str) -> tuple[StoredEvent, ...]:
        return self._by_key.get(key, ())

    def last(self) -> StoredEvent | None:
        return self._events[-1] if self._events else None

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
    def writing(self) -> Iterator[MemoryLockedLog]:
        with self._lock:
            section = MemoryLockedLog(self)
            yield section
            section.commit()


class MemoryLockedLog:
    """A ``writing`` section of a ``MemoryLog``: appends become visible when it ends."""

    def __init__(self, log: MemoryLog) -> None:
        self._log = log
        self._pending: list[tuple[StoredEvent, str]] = []  # (event, its hash)
        self._keys: dict[str, tuple[StoredEvent, ...]] = {}

    def read(self, after: int) -> Iterator[StoredEvent]:
        return self._log.read(after)

    def by_command(self, key: str) -> tuple[StoredEvent, ...]:
        return self._keys.get(key) or self._log.by_command(key)

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
        written = [e for e, _ in self._pending]
        last = written[-1] if written else self._log.last()
        head = 0 if last is None else last.position
        if expected_head is not None and head != expected_head:
            raise ConcurrencyConflict(expected_head, head)
        rows = chained_rows(
            events,
            head=head,
            prev_hash=self._pending[-1][1] if self._pending else self._log._hash,
            last_time=None if last is None else last.recorded_at,
            actor=actor,
            reason=reason,
            key=key,
            now=now,
        )
        self._pending.extend((event, value) for event, _, value in rows)
        appended = tuple(event for event, _, _ in rows)
        self._keys[appended[0].command_id] = appended
        return AppendOutcome(appended, already_recorded=False)

    def commit(self) -> None:
        log = self._log
        for event, value in self._pending:
            log._events.append(event)
            log._hash = value
        for key, events in self._keys.items():
            log._by_key[key] = events
        self._pending.clear()
        self._keys.clear()
