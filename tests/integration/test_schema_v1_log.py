"""A log written by the first release still reads, replays and verifies after every migration.

``tests/data/catalog_v1.sqlite`` was written by ``llmgw add``/``remove`` at
commit 7a3b096 (schema 0001_events, every event at schema_version 1) on the
declared ``catalog_v1.yaml``, adding ``examples/qwen-coder.yaml``,
``examples/coder-lite.yaml`` and ``catalog_v1_pair.yaml`` and removing two of
them; ``catalog_v1_models.json`` is what ``llmgw models --json`` printed then.
It is never written to: each test works on a copy (SQLite) or on its rows
loaded into a database at 0001 (PostgreSQL).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, Table, insert, select, update

from catalog import load_declared
from events.catalog_service import CatalogService
from events.core.chain import verify_chain
from events.core.upcast import upcast
from events.database.connection import make_engine
from events.database.migrate import current_revision, head_revision, upgrade
from events.database.tables import EventRow
from events.read.replay import replay
from events.storage.backends import open_log
from events.storage.chain_rows import read_chain, read_seal
from events.storage.history import HistoryQuery, history
from llmgw.views import catalog_json
from tests.support import model

DATA = Path(__file__).resolve().parent.parent / "data"
FIXTURE = DATA / "catalog_v1.sqlite"
DECLARED_FILE = DATA / "catalog_v1.yaml"
# SQLAlchemy types __table__ as a FromClause; a declarative table is a Table.
events_table: Table = EventRow.__table__  # type: ignore[assignment]
V1_COLUMNS = [c for c in events_table.c if c.name not in ("prev_hash", "hash")]


def _v1_rows(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(select(*V1_COLUMNS).order_by(events_table.c.position))
        return [dict(r._mapping) for r in rows]


@pytest.fixture(params=["sqlite", "postgres"])
def v1_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """The first release's log, at schema 0001, not yet migrated any further."""
    copy = tmp_path / "v1.sqlite"
    shutil.copy(FIXTURE, copy)
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{copy}")
    else:
        engine = make_engine(str(request.getfixturevalue("empty_pg_url")))
        upgrade(engine, "0001_events")
        source = make_engine(f"sqlite:///{copy}")
        rows = _v1_rows(source)
        source.dispose()
        with engine.begin() as conn:
            conn.execute(insert(events_table), rows)
    assert current_revision(engine) == "0001_events"
    yield engine
    engine.dispose()


def _subset(expected: Any, actual: Any) -> bool:
    """Every field the first release printed is there with the same value (a field added
    since, with its default, is not a difference in what was recorded)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and _subset(v, actual[k]) for k, v in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(_subset(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return bool(expected == actual)


def test_the_first_releases_log_migrates_replays_and_verifies(v1_engine: Engine) -> None:
    stored = _v1_rows(v1_engine)
    assert [r["schema_version"] for r in stored] == [1] * 6

    upgrade(v1_engine)
    assert current_revision(v1_engine) == head_revision()
    # Stored rows are never rewritten: every original column is byte for byte the same.
    assert _v1_rows(v1_engine) == stored

    declared = load_declared(DECLARED_FILE)
    store = open_log(v1_engine)
    result = replay(declared, store.read(), str(DECLARED_FILE))
    assert result.skipped == ()
    assert result.applied == (1, 2, 3, 4, 5, 6)
    expected = json.loads((DATA / "catalog_v1_models.json").read_text())
    actual = catalog_json(result.catalog)
    assert [m["name"] for m in actual] == [m["name"] for m in expected]
    assert _subset(expected, actual)

    # The six rows predate the chain: the migration sealed them, and they verify.
    report = verify_chain(read_chain(store.engine), read_seal(store.engine))
    assert report.ok and report.head_position == 6
    seal = read_seal(store.engine)
    assert seal is not None and seal.position == 6 and seal.hash == report.head_hash

    # An old add reads as the current version, the declared catalog it was checked against unknown.
    first = next(store.read())
    assert first.schema_version == 1
    assert upcast(first.type, 1, json.loads(first.payload))["declared_digest"] is None

    # History works on the old rows as on new ones.
    dave = [e.position for e in history(store.engine, HistoryQuery(actor="dave"))]
    assert dave == [3, 4, 6]


def test_appends_after_the_migration_chain_onto_the_seal(v1_engine: Engine) -> None:
    upgrade(v1_engine)
    declared = load_declared(DECLARED_FILE)
    store = open_log(v1_engine)
    service = CatalogService(store, declared, str(DECLARED_FILE))
    service.add([model("after-upgrade", fallbacks=["coder"])], actor="erin")
    seal = read_seal(store.engine)
    assert seal is not None
    rows = list(read_chain(store.engine))
    assert rows[6].prev_hash == seal.hash
    report = verify_chain(read_chain(store.engine), seal)
    assert report.ok and report.head_position == 7 and report.adopted == 0
    assert service.catalog().names() == sorted(
        [*(m["name"] for m in json.loads((DATA / "catalog_v1_models.json").read_text())),
         "after-upgrade"]
    )  # fmt: skip

    # An edit of a row from before the chain is caught by the seal.
    with v1_engine.begin() as conn:
        conn.execute(
            update(events_table).where(events_table.c.position == 2).values(actor="mallory")
        )
    report = verify_chain(read_chain(store.engine), read_seal(store.engine))
    assert not report.ok and report.failed_at == 6
    assert "before the hash chain" in (report.reason or "")
