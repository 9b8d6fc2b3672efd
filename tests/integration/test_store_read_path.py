"""``SqlLog.read`` fetches with the driver's cursor: the events must be exactly SQLAlchemy's.

The read path compiles its SQL once per shape of query and converts
``recorded_at`` itself; these check it against a plain SQLAlchemy select of the
same rows, on each back end, for every filter, and that the batch size is
honoured even when it changes after the SQL was first compiled.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, select

import events.storage.sql_reads as store_module
from events.core.rows import to_event as _to_event
from events.core.types import NewEvent, StoredEvent
from events.storage.backends import open_log
from events.storage.sql_log import SqlLog
from events.storage.sql_reads import _COLUMNS, t


def _fill(store: SqlLog, count: int) -> None:
    start = datetime(2026, 11, 30, 23, 59, 59, 999_999, tzinfo=UTC)
    for i in range(count):
        name = f"m{i % 3}"
        store.append(
            [NewEvent("model.removed", name, json.dumps({"name": name}))],
            expected_head=None,
            now=start + timedelta(microseconds=i),
        )


def _plain(engine: Engine) -> list[StoredEvent]:
    with engine.connect() as conn:
        rows = conn.execute(select(*_COLUMNS).order_by(t.c.position)).all()
    return [_to_event(row) for row in rows]


def test_read_gives_exactly_the_rows_sqlalchemy_gives(engine: Engine) -> None:
    store = open_log(engine)
    _fill(store, 7)
    plain = _plain(engine)
    assert list(store.read()) == plain
    assert [e.recorded_at.tzinfo for e in store.read()] == [UTC] * 7
    assert list(store.read(after=2, until=5)) == plain[2:5]
    assert list(store.read(model="m1")) == [e for e in plain if e.model == "m1"]
    assert list(store.read(after=1, until=6, model="m0")) == [
        e for e in plain[1:6] if e.model == "m0"
    ]
    assert list(store.read(after=7)) == []


def test_read_follows_the_batch_size_even_after_compiling(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_log(engine)
    _fill(store, 7)
    assert len(list(store.read())) == 7  # compiled with the default batch size
    monkeypatch.setattr(store_module, "READ_BATCH", 2)
    assert [e.position for e in store.read()] == list(range(1, 8))
    monkeypatch.setattr(store_module, "READ_BATCH", 3)
    assert [e.position for e in store.read(after=1)] == list(range(2, 8))
