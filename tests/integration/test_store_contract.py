"""The event store's contract, run unchanged against SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine

from events import store as store_module
from events.backends import open_log
from events.log import ConcurrencyConflict
from events.types import NewEvent


def _event(name: str) -> NewEvent:
    return NewEvent(type="model.added", model=name, payload=json.dumps({"model": {"name": name}}))


def test_an_empty_log_has_head_zero_and_no_events(engine: Engine) -> None:
    store = open_log(engine)
    assert store.head() == 0
    assert list(store.read()) == []


def test_positions_start_at_one_and_are_gapless(engine: Engine) -> None:
    store = open_log(engine)
    for i in range(5):
        store.append([_event(f"m{i}")], expected_head=i)
    store.append([_event("a"), _event("b"), _event("c")], expected_head=5)
    assert [e.position for e in store.read()] == list(range(1, 9))
    assert store.head() == 8


def test_an_append_against_a_stale_head_is_refused_and_writes_nothing(engine: Engine) -> None:
    store = open_log(engine)
    store.append([_event("a")], expected_head=0)
    with pytest.raises(ConcurrencyConflict) as caught:
        store.append([_event("b")], expected_head=0)
    assert (caught.value.expected, caught.value.actual) == (0, 1)
    assert [e.model for e in store.read()] == ["a"]


def test_the_same_key_twice_appends_once_and_returns_the_first_events(engine: Engine) -> None:
    store = open_log(engine)
    first = store.append([_event("a"), _event("b")], expected_head=0, key="k-1", actor="alice")
    again = store.append([_event("a"), _event("b")], expected_head=2, key="k-1", actor="alice")
    assert not first.already_recorded
    assert again.already_recorded
    assert [e.position for e in again.events] == [1, 2]
    assert again.events[0].event_id == "k-1"
    assert store.head() == 2
    assert store.by_command("k-1") == again.events


def test_events_keep_actor_reason_and_a_utc_time(engine: Engine) -> None:
    store = open_log(engine)
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


def test_recorded_time_never_goes_backwards_along_the_log(engine: Engine) -> None:
    store = open_log(engine)
    late = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    store.append([_event("a")], expected_head=0, now=late)
    # A replica whose clock is behind appends next: time order must still be log order.
    store.append([_event("b")], expected_head=1, now=late - timedelta(minutes=5))
    times = [e.recorded_at for e in store.read()]
    assert times == sorted(times)
    assert store.position_at(late) == 2
    assert store.position_at(late - timedelta(seconds=1)) == 0


def test_read_streams_a_range_across_batch_boundaries(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "READ_BATCH", 3)
    store = open_log(engine)
    store.append([_event(f"m{i}") for i in range(10)], expected_head=0)
    assert [e.position for e in store.read()] == list(range(1, 11))
    assert [e.position for e in store.read(after=2, until=8)] == [3, 4, 5, 6, 7, 8]
    assert [e.model for e in store.read(model="m4")] == ["m4"]


def test_an_append_of_nothing_is_a_programming_error(engine: Engine) -> None:
    with pytest.raises(ValueError, match="nothing to append"):
        open_log(engine).append([], expected_head=0)
