"""Tamper evidence: the hash chain written by every append, and what ``verify`` catches."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, Table, delete, insert, select, update

from catalog import Catalog
from events.catalog_service import CatalogService
from events.core.chain import GENESIS, VerifyReport, verify_chain
from events.core.types import NewEvent
from events.database.connection import make_engine
from events.database.tables import EventRow
from events.storage.backends import open_log
from events.storage.chain_rows import read_chain, read_seal
from tests.support import model

# SQLAlchemy types __table__ as a FromClause; a declarative table is a Table.
events_table: Table = EventRow.__table__  # type: ignore[assignment]


def _service(engine: Engine) -> CatalogService:
    return CatalogService(open_log(engine), Catalog.build([]), snapshot_every=None)


def _verify(engine: Engine, expect_head: str | None = None) -> VerifyReport:
    store = open_log(engine)
    return verify_chain(read_chain(store.engine), read_seal(store.engine), expect_head)


@pytest.fixture
def logged(engine: Engine) -> Engine:
    """Six events: five adds (one a list of two) and a removal."""
    service = _service(engine)
    service.add([model("a")], actor="alice")
    service.add([model("b"), model("c", fallbacks=["b"])], actor="bob")
    service.add([model("d")], actor="alice")
    service.remove("a", actor="carol")
    service.add([model("e")], actor="dave")
    return engine


def _set(engine: Engine, position: int, **values: object) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(events_table).where(events_table.c.position == position).values(**values)
        )


def test_each_append_chains_onto_the_previous_events_hash(logged: Engine) -> None:
    rows = list(read_chain(logged))
    assert [r.position for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0].prev_hash == GENESIS
    for before, row in itertools.pairwise(rows):
        assert row.prev_hash == before.hash
    assert all(r.hash == r.computed_hash(r.prev_hash or "") for r in rows)
    report = _verify(logged)
    assert report.ok and report.head_position == 6 and report.head_hash == rows[-1].hash


def test_an_edited_row_is_caught_at_its_position(logged: Engine) -> None:
    _set(logged, 3, actor="mallory")
    report = _verify(logged)
    assert not report.ok
    assert report.failed_at == 3
    assert "edited" in (report.reason or "")


def test_an_edited_time_is_caught_at_its_position(logged: Engine) -> None:
    _set(logged, 5, recorded_at=datetime(2031, 1, 1, tzinfo=UTC))
    assert _verify(logged).failed_at == 5


def test_a_deleted_row_is_caught_at_its_position(logged: Engine) -> None:
    with logged.begin() as conn:
        conn.execute(delete(events_table).where(events_table.c.position == 4))
    report = _verify(logged)
    assert report.failed_at == 4
    assert "missing" in (report.reason or "")


def test_a_deleted_row_with_the_rest_renumbered_is_caught_at_its_position(
    logged: Engine,
) -> None:
    with logged.begin() as conn:
        conn.execute(delete(events_table).where(events_table.c.position == 4))
        for position in (5, 6):
            conn.execute(
                update(events_table)
                .where(events_table.c.position == position)
                .values(position=position - 1)
            )
    report = _verify(logged)
    assert report.failed_at == 4
    assert "removed, inserted or reordered" in (report.reason or "")


def test_reordered_rows_are_caught_at_the_first_moved_position(logged: Engine) -> None:
    with logged.begin() as conn:
        for old, new in ((2, 100), (5, 2), (100, 5)):
            conn.execute(
                update(events_table).where(events_table.c.position == old).values(position=new)
            )
    assert _verify(logged).failed_at == 2


def test_an_edit_whose_hash_was_recomputed_breaks_the_next_link(logged: Engine) -> None:
    _set(logged, 3, reason="nothing to see")
    (edited,) = [r for r in read_chain(logged) if r.position == 3]
    forged = edited.computed_hash(edited.prev_hash or "")
    _set(logged, 3, hash=forged)
    report = _verify(logged)
    assert report.failed_at == 4


def test_truncation_is_caught_against_a_head_recorded_elsewhere(logged: Engine) -> None:
    recorded = _verify(logged).head_hash
    _service(logged).add([model("f")])
    # The log grew since the head was recorded: that head is still in the chain.
    grown = _verify(logged, expect_head=recorded)
    assert grown.ok and grown.expected_head_at == 6
    with logged.begin() as conn:
        conn.execute(delete(events_table).where(events_table.c.position >= 6))
    assert _verify(logged).ok, "a chain alone cannot see its end cut off"
    cut = _verify(logged, expect_head=recorded)
    assert not cut.ok
    assert cut.failed_at == 6
    assert "truncated or rewritten" in (cut.reason or "")


def test_a_log_copied_between_back_ends_verifies_with_the_same_head(
    sqlite_url: str, pg_url: str
) -> None:
    # recorded_at is stored differently (SQLite: text without a zone; PostgreSQL:
    # timestamptz) and must hash the same, including times with no microseconds.
    source, target = make_engine(sqlite_url), make_engine(pg_url)
    open_log(source).append(
        [NewEvent(type="model.added", model="a", payload=json.dumps({"model": {"name": "a"}}))],
        expected_head=0,
        now=datetime(2026, 12, 1, 12, 0, tzinfo=UTC),
    )
    _service(source).add([model("b")], actor="José", reason="ünïcode")
    with source.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(select(events_table))]
    with target.begin() as conn:
        conn.execute(insert(events_table), rows)
    here, there = _verify(source), _verify(target)
    assert here.ok and there.ok
    assert here.head_hash == there.head_hash
    source.dispose()
    target.dispose()
