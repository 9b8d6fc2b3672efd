"""Who changed what, when: the history query, filtered in SQL, on both back ends."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine

from events.core.types import NewEvent
from events.storage import sql_reads as store_module
from events.storage.backends import open_log
from events.storage.history import HistoryQuery, history
from events.storage.sql_log import SqlLog

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def _added(name: str) -> NewEvent:
    return NewEvent(type="model.added", model=name, payload=json.dumps({"model": {"name": name}}))


def _removed(name: str) -> NewEvent:
    return NewEvent(type="model.removed", model=name, payload=json.dumps({"name": name}))


@pytest.fixture
def store(engine: Engine) -> SqlLog:
    store = open_log(engine)
    store.append([_added("a")], expected_head=0, actor="alice", now=T0)
    store.append([_added("b"), _added("c")], expected_head=1, actor="bob", now=T0 + timedelta(1))
    store.append([_removed("a")], expected_head=3, actor="alice", now=T0 + timedelta(2))
    store.append([_removed("b")], expected_head=4, actor="carol", now=T0 + timedelta(3))
    return store


def _positions(store: SqlLog, **filters: Any) -> list[int]:
    return [e.position for e in history(store.engine, HistoryQuery(**filters))]


def test_each_filter_keeps_only_the_matching_events_in_log_order(store: SqlLog) -> None:
    assert _positions(store) == [1, 2, 3, 4, 5]
    assert _positions(store, model="a") == [1, 4]
    assert _positions(store, actor="alice") == [1, 4]
    assert _positions(store, type="model.removed") == [4, 5]
    assert _positions(store, model="nobody") == []


def test_time_bounds_are_inclusive_and_combine_with_the_other_filters(store: SqlLog) -> None:
    day1 = T0 + timedelta(1)
    assert _positions(store, since=day1) == [2, 3, 4, 5]
    assert _positions(store, until=day1) == [1, 2, 3]
    assert _positions(store, since=day1, until=day1) == [2, 3]
    assert _positions(store, since=day1, actor="alice") == [4]
    assert _positions(store, since=day1, until=T0 + timedelta(2), type="model.added") == [2, 3]


def test_history_streams_across_batches_with_filters(
    store: SqlLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "READ_BATCH", 2)
    store.append([_added(f"x{i}") for i in range(7)], expected_head=5, actor="dave", now=T0)
    assert _positions(store, actor="dave") == list(range(6, 13))
    assert [e.model for e in history(store.engine, HistoryQuery(type="model.added"))][:3] == [
        "a",
        "b",
        "c",
    ]
