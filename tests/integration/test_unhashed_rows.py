"""A row without a hash after the chain's seal: a forgery until an operator adopts it."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, Table, select, update

from catalog import Catalog
from events.audit.adoption import AdoptionRefused, adopt_unhashed, adoptions_table, verify_log
from events.catalog_service import CatalogService
from events.core.chain import VerifyReport
from events.database.tables import EventRow
from events.storage.backends import open_log
from events.write.commands import CommandConflict
from tests.support import insert_raw_event, model

# SQLAlchemy types __table__ as a FromClause; a declarative table is a Table.
events_table: Table = EventRow.__table__  # type: ignore[assignment]


def _service(engine: Engine) -> CatalogService:
    return CatalogService(open_log(engine), Catalog.build([]), snapshot_every=None)


def _verify(engine: Engine) -> VerifyReport:
    return verify_log(open_log(engine))


@pytest.fixture
def logged(engine: Engine) -> Engine:
    service = _service(engine)
    for name in "abcde":
        service.add([model(name)], actor="alice")
    return engine


def _set(engine: Engine, position: int, **values: object) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(events_table).where(events_table.c.position == position).values(**values)
        )


def test_a_forged_row_without_a_hash_fails_verify_at_its_position(logged: Engine) -> None:
    insert_raw_event(logged, 6, payload={"model": {"name": "forged"}}, model="forged", hashed=False)
    report = _verify(logged)
    assert not report.ok
    assert report.failed_at == 6
    assert "carries no hash" in (report.reason or "")
    assert "--adopt-unhashed" in (report.reason or "")


def test_rows_edited_with_their_hashes_set_to_null_fail_verify(logged: Engine) -> None:
    _set(logged, 4, actor="mallory", hash=None, prev_hash=None)
    _set(logged, 5, hash=None, prev_hash=None)
    report = _verify(logged)
    assert not report.ok
    assert report.failed_at == 4


def test_an_append_does_not_chain_over_a_row_nobody_vouches_for(logged: Engine) -> None:
    insert_raw_event(logged, 6, payload={"model": {"name": "forged"}}, model="forged", hashed=False)
    with pytest.raises(CommandConflict, match="position 6, carries no hash"):
        _service(logged).add([model("g")])
    assert open_log(logged).head() == 6, "nothing was written"
    assert _verify(logged).failed_at == 6


def test_adopting_an_unhashed_row_is_recorded_and_later_edits_are_still_caught(
    logged: Engine,
) -> None:
    # An older replica, still running during an upgrade, appended without a hash.
    insert_raw_event(
        logged, 6, type="model.removed", payload={"name": "d"}, model="d", hashed=False
    )
    store = open_log(logged)
    report, adopted = adopt_unhashed(store, actor="ops", reason="replica v1 ran during upgrade")
    assert adopted == (6,)
    assert report.ok and report.adopted == 1
    with logged.connect() as conn:
        row = conn.execute(select(adoptions_table)).one()
    assert (row.position, row.actor, row.reason) == (6, "ops", "replica v1 ran during upgrade")
    _service(logged).add([model("g")])
    assert _verify(logged).ok and _verify(logged).head_position == 7
    _set(logged, 6, actor="mallory")
    edited = _verify(logged)
    assert edited.failed_at == 6
    assert "changed since it was adopted" in (edited.reason or "")


def test_adopting_needs_an_actor_and_a_reason(logged: Engine) -> None:
    insert_raw_event(logged, 6, payload={"model": {"name": "x"}}, model="x", hashed=False)
    with pytest.raises(AdoptionRefused, match="--actor NAME and --reason WHY"):
        adopt_unhashed(open_log(logged), actor="ops", reason=" ")
    assert _verify(logged).failed_at == 6


def test_adopting_over_a_chain_broken_elsewhere_adopts_nothing(logged: Engine) -> None:
    _set(logged, 2, actor="mallory")
    insert_raw_event(logged, 6, payload={"model": {"name": "x"}}, model="x", hashed=False)
    report, adopted = adopt_unhashed(open_log(logged), actor="ops", reason="upgrade")
    assert adopted == ()
    assert report.failed_at == 2
    with logged.connect() as conn:
        assert conn.execute(select(adoptions_table)).all() == []
