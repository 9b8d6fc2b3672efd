"""Group commit: many concurrent writers, one transaction (and one fsync) per batch.

Node reports arrive from every agent every few seconds, each a small write that
must be durable before it is answered. One transaction each makes the commit's
fsync the ceiling (a few hundred a second on one disk, and SQLite takes one
writer at a time anyway). Here the callers that arrive while a batch is being
written wait together; the first of them to find the writer free takes all that
have queued up (up to ``max_batch``) and writes them in one transaction, then
hands each caller its own result. A lone caller is written at once: batching
adds no delay, it only shares the cost of a commit among those who were
waiting for it.

Every caller still returns only after its own write committed, so what an
answer promises is as durable as before. A batch that fails is written again
one item at a time, so one bad item is refused on its own and cannot fail the
others that happened to share its batch.

Two items with the same ``key`` never share a batch (an upsert cannot touch
one row twice in one statement); the later waits for the next batch, which
also keeps their order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_BATCH = 512


@dataclass(eq=False)
class _Slot(Generic[T, R]):
    item: T
    key: Hashable
    done: bool = False
    settled: bool = False
    result: R | None = None
    error: BaseException | None = None


class GroupCommit(Generic[T, R]):
    """``submit(item)`` blocks until ``write([... item ...])`` has committed it.

    ``write`` takes a batch and returns one result per item, in order; it runs
    in the submitting threads (whichever leads the batch), never on an event loop.
    """

    def __init__(
        self,
        write: Callable[[Sequence[T]], Sequence[R]],
        key: Callable[[T], Hashable],
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._write = write
        self._key = key
        self._max_batch = max_batch
        self._cond = threading.Condition()
        self._queue: list[_Slot[T, R]] = []
        self._writing = False
        self.batches = 0  # transactions written (the tests and the metrics read it)
        self.items = 0

    def submit(self, item: T) -> R:
        slot: _Slot[T, R] = _Slot(item, self._key(item))
        with self._cond:
            self._queue.append(slot)
        while True:
            with self._cond:
                while self._writing and not slot.done:
                    self._cond.wait()
                if slot.done:
                    break
                batch = self._take()
                self._writing = True
            try:
                self._settle(batch)
            except BaseException as exc:  # not a write's refusal: the process is stopping
                for s in batch:
                    if not s.settled:
                        s.error = exc
                raise
            finally:
                with self._cond:
                    for s in batch:
                        s.done = True
                    self._writing = False
                    self._cond.notify_all()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

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
        try:
            results = self._write([s.item for s in batch])
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error, batch[0].settled = exc, True
                return
        else:
            self.batches += 1
            self.items += len(batch)
            for slot, result in zip(batch, results, strict=True):
                slot.result, slot.settled = result, True
            return
        # One item spoilt the batch: each on its own, so only that one is refused.
        for slot in batch:
            try:
                (slot.result,) = self._write([slot.item])
                self.batches += 1
                self.items += 1
            except Exception as exc:
                slot.error = exc
            slot.settled = True
