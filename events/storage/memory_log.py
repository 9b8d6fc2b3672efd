"""The event log in memory: the contract of events.storage.log with nothing stored.

For unit tests of what runs against a log (the commands, the read model):
the same positions, ids, times, hashes, idempotency and head checks as the SQL
logs, checked by the same contract suite. A lock held for a ``writing``
section makes writers queue, as the databases' locks do; nothing is written
unless the section ends without an exception.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from events.core.chain import GENESIS
from events.core.rows import ReplayEvent
from events.core.types import StoredEvent
from events.storage.log import ChainedRow, SectionedLog, WriteSection


class MemoryLog(SectionedLog):
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

    @contextmanager
    def writing(self) -> Iterator[MemoryLockedLog]:
        with self._lock:
            section = MemoryLockedLog(self)
            yield section
            section.commit()


class MemoryLockedLog(WriteSection):
    """A ``writing`` section of a ``MemoryLog``: appends become visible when it ends."""

    def __init__(self, log: MemoryLog) -> None:
        self._log = log
        self._pending: list[tuple[StoredEvent, str]] = []  # (event, its hash)
        self._keys: dict[str, tuple[StoredEvent, ...]] = {}

    def read(self, after: int) -> Iterator[StoredEvent]:
        return self._log.read(after)

    def by_command(self, key: str) -> tuple[StoredEvent, ...]:
        return self._keys.get(key) or self._log.by_command(key)

    def tail(self) -> tuple[int, datetime | None]:
        last = self._pending[-1][0] if self._pending else self._log.last()
        return (0, None) if last is None else (last.position, last.recorded_at)

    def head_hash(self, head: int) -> str:
        return self._pending[-1][1] if self._pending else self._log._hash

    def write(self, rows: list[ChainedRow]) -> None:
        self._pending.extend((event, value) for event, _, value in rows)
        appended = tuple(event for event, _, _ in rows)
        self._keys[appended[0].command_id] = appended

    def commit(self) -> None:
        log = self._log
        for event, value in self._pending:
            log._events.append(event)
            log._hash = value
        for key, events in self._keys.items():
            log._by_key[key] = events
        self._pending.clear()
        self._keys.clear()
