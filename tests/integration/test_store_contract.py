"""The log's contract (events.storage.log), run unchanged against every implementation.

One suite, three back ends: the in-memory log the command tests use, SQLite
and PostgreSQL (a fresh migrated database per test; PostgreSQL is required
when LLMGW_REQUIRE_POSTGRES=1, tests/conftest.py). A behaviour the commands
rely on belongs here, so that the in-memory log cannot drift from the real ones.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from events.core.types import NewEvent
from events.database.connection import make_engine
from events.storage import sql_reads as store_module
from events.storage.backends import open_log
from events.storage.log import ConcurrencyConflict, Log
from events.storage.memory_log import MemoryLog


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def log(request: pytest.FixtureRequest) -> Iterator[Log]:
    """An empty log on each back end in turn."""
    if request.param == "memory":
        yield MemoryLog()
        return
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    engine = make_engine(str(url))
    yield open_log(engine)
    engine.dispose()


def _event(name: str) -> NewEvent:
    return NewEvent(type="model.added", model=name, payload=json.dumps({"model": {"name": name}}))


def test_an_empty_log_has_head_zero_and_no_events(log: Log) -> None:
    store = log
    assert store.head() == 0
    assert list(store.read()) == []


def test_positions_start_at_one_and_are_gapless(log: Log) -> None:
    store = log
    for i in range(5):
        store.append([_event(f"m{i}")], expected_head=i)
    store.append([_event("a"), _event("b"), _event("c")], expected_head=5)
    assert [e.position for e in store.read()] == list(range(1, 9))
    assert store.head() == 8


def test_an_append_against_a_stale_head_is_refused_and_writes_nothing(log: Log) -> None:
    store = log
    store.append([_event("a")], expected_head=0)
    with pytest.raises(ConcurrencyConflict) as caught:
        store.append([_event("b")], expected_head=0)
    assert (caught.value.expected, caught.value.actual) == (0, 1)
    assert [e.model for e in store.read()] == ["a"]


def test_the_same_key_twice_appends_once_and_returns_the_first_events(log: Log) -> None:
    store = log
    first = store.append([_event("a"), _event("b")], expected_head=0, key="k-1", actor="alice")
    again = store.append([_event("a"), _event("b")], expected_head=2, key="k-1", actor="alice")
    assert not first.already_recorded
    assert again.already_recorded
    assert [e.position for e in again.events] == [1, 2]
    assert again.events[0].event_id == "k-1"
    assert store.head() == 2
    assert store.by_command("k-1") == again.events


def test_events_keep_actor_reason_and_a_utc_time(log: Log) -> None:
    store = log
    before = datetime.now(UTC)
    store.append([_event("a")], expected_head=0, actor="alice", reason="try before review")
    (event,) = store.read()
    assert (event.actor, event.reason, event.type, event.schema_version) == (
        "alice",
        "try before review",
        "model.added",
        1,
    )
    assert event.recorded_at.tzinfo is not None
    assert before - timedelta(seconds=1) <= event.recorded_at <= datetime.now(UTC)


def test_recorded_time_never_goes_backwards_along_the_log(log: Log) -> None:
    store = log
    late = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    store.append([_event("a")], expected_head=0, now=late)
    # A replica whose clock is behind appends next: time order must still be log order.
    store.append([_event("b")], expected_head=1, now=late - timedelta(minutes=5))
    times = [e.recorded_at for e in store.read()]
    assert times == sorted(times)
    assert store.position_at(late) == 2
    assert store.position_at(late - timedelta(seconds=1)) == 0


def test_read_streams_a_range_across_batch_boundaries(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "READ_BATCH", 3)
    store = log
    store.append([_event(f"m{i}") for i in range(10)], expected_head=0)
    assert [e.position for e in store.read()] == list(range(1, 11))
    assert [e.position for e in store.read(after=2, until=8)] == [3, 4, 5, 6, 7, 8]
    assert [e.model for e in store.read(model="m4")] == ["m4"]


def test_an_append_of_nothing_is_a_programming_error(log: Log) -> None:
    with pytest.raises(ValueError, match="nothing to append"):
        log.append([], expected_head=0)


def test_a_writing_section_reads_what_was_committed_and_appends_under_the_lock(log: Log) -> None:
    log.append([_event("a")], expected_head=0)
    with log.writing() as locked:
        assert [e.model for e in locked.read(after=0)] == ["a"]
        outcome = locked.append([_event("b")], expected_head=1, key="k-b")
        assert locked.by_command("k-b") == outcome.events
        again = locked.append([_event("b")], expected_head=2, key="k-b")
        assert again.already_recorded and again.events == outcome.events
    assert [e.model for e in log.read()] == ["a", "b"]
    assert log.by_command("k-b") == outcome.events


def test_a_writing_section_that_fails_writes_nothing(log: Log) -> None:
    log.append([_event("a")], expected_head=0)
    with pytest.raises(RuntimeError, match="validation failed"), log.writing() as locked:
        locked.append([_event("b")], expected_head=1, key="k-b")
        raise RuntimeError("validation failed")
    assert log.head() == 1
    assert log.by_command("k-b") == ()
    assert log.append([_event("c")], expected_head=1).events[0].position == 2


def test_an_unknown_key_has_no_events(log: Log) -> None:
    assert log.by_command("never-used") == ()


@pytest.mark.parametrize("size", [1, 15, 16, 17, 40])
def test_a_key_finds_exactly_its_commands_events_among_others(log: Log, size: int) -> None:
    """Keys are found through the first event's id (events.storage.sql_log): a command of any
    length, with other commands, keyed and not, before and after it."""
    log.append([_event("before")], expected_head=0, key="k-before")
    log.append([_event("unkeyed")], expected_head=1)
    mine = log.append([_event(f"m{i}") for i in range(size)], expected_head=2, key="k-mine")
    log.append([_event("after-1"), _event("after-2")], expected_head=2 + size, key="k-after")
    log.append([_event("tail")], expected_head=4 + size)

    assert log.by_command("k-mine") == mine.events
    assert [e.model for e in log.by_command("k-mine")] == [f"m{i}" for i in range(size)]
    assert [e.model for e in log.by_command("k-after")] == ["after-1", "after-2"]
    assert [e.model for e in log.by_command("k-before")] == ["before"]
    assert log.by_command("k-mine#2") == ()  # an event's id, not a command's key


def test_writers_in_sections_queue_and_none_loses_a_race(log: Log) -> None:
    """Each writer validates against the head it reads inside its section: with the
    lock, every one of them appends, and positions stay gapless."""
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        try:
            for i in range(5):
                with log.writing() as locked:
                    head = max((e.position for e in locked.read(after=0)), default=0)
                    locked.append([_event(f"{name}{i}")], expected_head=head)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [e.position for e in log.read()] == list(range(1, 16))
    assert log.head() == 15
