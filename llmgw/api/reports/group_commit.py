"""Group commit: many concurrent writers, one transaction (and one fsync) per batch.

Node reports arrive from every agent every few seconds, each a small write that
must be durable before it is answered. One transaction each makes the commit's
fsync the ceiling (a few hundred a second on one disk, and SQLite takes one
writer at a time anyway). Here one writer thread takes whatever callers have
queued up (up to ``max_batch``), writes them in one transaction, then hands
each caller its own result; the callers that arrive meanwhile go together in
the next. A lone caller is written at once: batching adds no delay, it only
shares the cost of a commit among those who were waiting for it.

Callers are threads (``submit`` blocks) or coroutines (``submit_async``): a
coroutine costs no worker thread while it waits, and the whole batch is handed
back to its event loop in one wake-up rather than one per caller, which is most
of what a thread per request cost the API's node reports.

Every caller still returns only after its own write committed, so what an
answer promises is as durable as before. A batch that fails is written again
one item at a time, so one bad item is refused on its own and cannot fail the
others that happened to share its batch. ``prepare``, if given, turns each
item into the form ``write`` takes (a body into its parsed report), in the
writer thread; an item it refuses is answered with that error and left out of
the batch.

Two items with the same ``key`` never share a batch (an upsert cannot touch
one row twice in one statement); the later waits for the next batch, which
also keeps their order.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_BATCH = 512


@dataclass(eq=False, slots=True)
class _Slot(Generic[T, R]):
    item: T
    key: Hashable
    # Set for a coroutine's item: where its answer is delivered.
    future: asyncio.Future[R] | None = None
    prepared: T | None = None
    done: bool = False
    settled: bool = False
    result: R | None = None
    error: BaseException | None = None


class GroupCommit(Generic[T, R]):
    """``submit(item)`` returns once ``write([... item ...])`` has committed it.

    ``write`` takes a batch and returns one result per item, in order; it runs in
    the group's writer thread, never on an event loop.
    """

    def __init__(
        self,
        write: Callable[[Sequence[T]], Sequence[R]],
        key: Callable[[T], Hashable],
        max_batch: int = MAX_BATCH,
        prepare: Callable[[T], T] | None = None,
    ) -> None:
        self._write = write
        self._key = key
        self._max_batch = max_batch
        self._prepare = prepare
        lock = threading.Lock()
        # Two conditions on one lock: the writer waits for work, threads for their answers,
        # so a caller's arrival wakes the writer (and only when it is idle), not them.
        self._work = threading.Condition(lock)
        self._answered = threading.Condition(lock)
        self._idle = False
        self._queue: list[_Slot[T, R]] = []
        self._thread: threading.Thread | None = None
        self.batches = 0  # transactions written (the tests and the metrics read it)
        self.items = 0

    def submit(self, item: T) -> R:
        """Block until ``item`` is committed; its result, or the error that refused it."""
        slot: _Slot[T, R] = _Slot(item, self._key(item))
        with self._work:
            self._enqueue(slot)
            while not slot.done:
                self._answered.wait()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    async def submit_async(self, item: T) -> R:
        """``submit`` for a coroutine: waits without holding a thread."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        slot: _Slot[T, R] = _Slot(item, self._key(item), future)
        with self._work:
            self._enqueue(slot)
        return await future

    def _enqueue(self, slot: _Slot[T, R]) -> None:
        self._queue.append(slot)
        if self._thread is None or not self._thread.is_alive():
            # Daemon: a process that is stopping does not wait for an idle writer.
            self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
            self._thread.start()
        elif self._idle:
            self._work.notify()

    def _run(self) -> None:
        while True:
            with self._work:
                while not self._queue:
                    self._idle = True
                    self._work.wait()
                    self._idle = False
                batch = self._take()
            try:
                self._settle(batch)
            except BaseException as exc:  # not a write's refusal: the process is stopping
                for s in batch:
                    if not s.settled:
                        s.error, s.settled = exc, True
                self._finish(batch)
                raise
            self._finish(batch)

    def _take(self) -> list[_Slot[T, R]]:
        """The next batch: the oldest waiting items, one per key, at most ``max_batch``."""
        batch: list[_Slot[T, R]] = []
        keys: set[Hashable] = set()
        rest: list[_Slot[T, R]] = []
        for slot in self._queue:
            if len(batch) < self._max_batch and slot.key not in keys:
                batch.append(slot)
                keys.add(slot.key)
            else:
                rest.append(slot)
        self._queue = rest
        return batch

    def _settle(self, batch: list[_Slot[T, R]]) -> None:
        ready: list[_Slot[T, R]] = []
        for slot in batch:
            if self._prepare is None:
                slot.prepared = slot.item
            else:
                try:
                    slot.prepared = self._prepare(slot.item)
                except Exception as exc:
                    slot.error, slot.settled = exc, True
                    continue
            ready.append(slot)
        if not ready:
            return
        try:
            results = self._write([s.prepared for s in ready])  # type: ignore[misc]
        except Exception as exc:
            if len(ready) == 1:
                ready[0].error, ready[0].settled = exc, True
                return
        else:
            self.batches += 1
            self.items += len(ready)
            for slot, result in zip(ready, results, strict=True):
                slot.result, slot.settled = result, True
            return
        # One item spoilt the batch: each on its own, so only that one is refused.
        for slot in ready:
            try:
                (slot.result,) = self._write([slot.prepared])  # type: ignore[list-item]
                self.batches += 1
                self.items += 1
            except Exception as exc:
                slot.error = exc
            slot.settled = True

    def _finish(self, batch: list[_Slot[T, R]]) -> None:
        """Answer the batch's callers: threads by one notify, each event loop by one wake-up."""
        loops: dict[asyncio.AbstractEventLoop, list[_Slot[T, R]]] = {}
        threads = False
        with self._work:
            for s in batch:
                s.done = True
                if s.future is None:
                    threads = True
                else:
                    loops.setdefault(s.future.get_loop(), []).append(s)
            if threads:
                self._answered.notify_all()
        for loop, slots in loops.items():
            # A loop that is closed has no callers left to answer.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_deliver, slots)


def _deliver(slots: list[_Slot[Any, Any]]) -> None:
    for s in slots:
        assert s.future is not None
        if s.future.cancelled():
            continue
        if s.error is not None:
            s.future.set_exception(s.error)
        else:
            s.future.set_result(s.result)
