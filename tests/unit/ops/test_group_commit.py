"""Group commit with real threads: each caller gets its own result, after its own write,
callers that wait share a transaction, and one bad item spoils no one else's write."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest

from llmgw.api.reports.group_commit import GroupCommit


class Log:
    """A stand-in for the database: each write is a 'transaction' recorded whole."""

    def __init__(self, bad: str = "", slow: float = 0.0) -> None:
        self.transactions: list[list[tuple[str, int]]] = []
        self.bad = bad
        self.slow = slow
        self.lock = threading.Lock()

    def write(self, batch: Sequence[tuple[str, int]]) -> list[str]:
        with self.lock:  # a write never overlaps another
            time.sleep(self.slow)
            if any(name == self.bad for name, _ in batch):
                raise OverflowError(f"{self.bad} does not fit")
            self.transactions.append(list(batch))
            return [f"{name}#{k} committed" for name, k in batch]


def _submit_all(
    group: GroupCommit[tuple[str, int], str], items: list[tuple[str, int]]
) -> dict[tuple[str, int], object]:
    results: dict[tuple[str, int], object] = {}
    start = threading.Barrier(len(items))

    def one(item: tuple[str, int]) -> None:
        start.wait()
        try:
            results[item] = group.submit(item)
        except Exception as exc:
            results[item] = exc

    threads = [threading.Thread(target=one, args=(item,)) for item in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_concurrent_callers_share_transactions_and_each_gets_its_own_result() -> None:
    log = Log(slow=0.02)
    group = GroupCommit(log.write, key=lambda item: item[0])
    items = [(f"node-{i:02d}", 0) for i in range(48)]
    results = _submit_all(group, items)
    assert results == {item: f"{item[0]}#0 committed" for item in items}
    # Each written exactly once, and far fewer commits than reports: while one
    # transaction commits, the others queue and go together in the next.
    written = [item for tx in log.transactions for item in tx]
    assert sorted(written) == sorted(items)
    assert len(log.transactions) < len(items) // 4
    assert (group.batches, group.items) == (len(log.transactions), len(items))


def test_two_reports_of_one_node_never_share_a_transaction_and_keep_their_order() -> None:
    log = Log(slow=0.01)
    group = GroupCommit(log.write, key=lambda item: item[0])
    items = [(f"node-{i % 4}", i) for i in range(40)]
    _submit_all(group, items)
    for tx in log.transactions:
        names = [name for name, _ in tx]
        assert len(names) == len(set(names)), tx
    # A node's reports are written in the order they were taken; the barrier lets
    # threads queue in any order, so check only that every one was written once.
    assert sorted(item for tx in log.transactions for item in tx) == sorted(items)


def test_a_bad_item_is_refused_alone_and_the_rest_of_its_batch_commits() -> None:
    log = Log(bad="node-07", slow=0.01)
    group = GroupCommit(log.write, key=lambda item: item[0])
    items = [(f"node-{i:02d}", 0) for i in range(24)]
    results = _submit_all(group, items)
    refused = {item: r for item, r in results.items() if isinstance(r, Exception)}
    assert list(refused) == [("node-07", 0)]
    assert isinstance(refused["node-07", 0], OverflowError)
    written = sorted(item for tx in log.transactions for item in tx)
    assert written == sorted(i for i in items if i[0] != "node-07")


def test_a_lone_caller_is_written_at_once() -> None:
    log = Log()
    group = GroupCommit(log.write, key=lambda item: item[0])
    began = time.monotonic()
    assert group.submit(("n", 1)) == "n#1 committed"
    assert time.monotonic() - began < 5  # no waiting for company: bound, not a timing
    assert log.transactions == [[("n", 1)]]


def test_a_write_that_fails_for_everyone_fails_each_caller() -> None:
    def broken(batch: Sequence[tuple[str, int]]) -> list[str]:
        raise RuntimeError("the database is gone")

    group: GroupCommit[tuple[str, int], str] = GroupCommit(broken, key=lambda item: item[0])
    results = _submit_all(group, [(f"n{i}", 0) for i in range(8)])
    assert all(isinstance(r, RuntimeError) for r in results.values())
    with pytest.raises(RuntimeError, match="gone"):
        group.submit(("again", 0))


def test_coroutines_share_transactions_with_threads_and_each_gets_its_own_result() -> None:
    log = Log(slow=0.02)
    group = GroupCommit(log.write, key=lambda item: item[0])
    coroutine_items = [(f"c-{i:02d}", 0) for i in range(40)]

    async def all_of_them() -> list[object]:
        return await asyncio.gather(
            *(group.submit_async(item) for item in coroutine_items), return_exceptions=True
        )

    thread_items = [(f"t-{i:02d}", 0) for i in range(8)]
    threads: dict[tuple[str, int], object] = {}
    helper = threading.Thread(target=lambda: threads.update(_submit_all(group, thread_items)))
    helper.start()
    answers = asyncio.run(all_of_them())
    helper.join(60)

    assert answers == [f"{name}#0 committed" for name, _ in coroutine_items]
    assert threads == {item: f"{item[0]}#0 committed" for item in thread_items}
    written = sorted(item for tx in log.transactions for item in tx)
    assert written == sorted(coroutine_items + thread_items)
    assert len(log.transactions) < len(written) // 4


def test_an_item_prepare_refuses_is_answered_alone_and_never_written() -> None:
    log = Log(slow=0.01)

    def prepare(item: tuple[str, int]) -> tuple[str, int]:
        if item[1] < 0:
            raise ValueError(f"{item[0]}: negative")
        return item

    group = GroupCommit(log.write, key=lambda item: item[0], prepare=prepare)
    items = [(f"n{i}", -1 if i == 3 else i) for i in range(12)]

    async def all_of_them() -> list[object]:
        return await asyncio.gather(
            *(group.submit_async(item) for item in items), return_exceptions=True
        )

    answers = dict(zip(items, asyncio.run(all_of_them()), strict=True))
    refused = {item: a for item, a in answers.items() if isinstance(a, Exception)}
    assert list(refused) == [("n3", -1)]
    assert str(refused["n3", -1]) == "n3: negative"
    written = sorted(item for tx in log.transactions for item in tx)
    assert written == sorted(i for i in items if i != ("n3", -1))
