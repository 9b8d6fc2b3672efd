"""A forged snapshot: caught by verify (replay to its position), refused at start-up with a key."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

from sqlalchemy import Engine, Table, select, update
from structlog.testing import capture_logs

from catalog import Catalog
from events.audit.snapshot_check import audit_snapshots
from events.catalog_service import CatalogService
from events.database.tables import SnapshotRow
from events.read.replay import replay
from events.read.snapshots import _checksum
from events.storage.backends import open_log
from tests.support import model

# SQLAlchemy types __table__ as a FromClause; a declarative table is a Table.
snapshots_table: Table = SnapshotRow.__table__  # type: ignore[assignment]
CONFIG = "deploy/catalog.yaml"
DECLARED = Catalog.build([model("llama-70b", aliases=["llama"])])
KEY = b"k" * 32


def _service(engine: Engine, key: bytes | None = None) -> CatalogService:
    return CatalogService(open_log(engine), DECLARED, CONFIG, snapshot_key=key)


def _logged(engine: Engine, key: bytes | None = None) -> int:
    """Three adds and a snapshot of them; the snapshot's id."""
    writer = _service(engine, key)
    for name in ("a", "b", "c"):
        writer.add([model(name)])
    snapshot = writer.snapshot()
    assert snapshot is not None
    return snapshot


def _forge(engine: Engine, snapshot: int) -> None:
    """What anyone with write access to the table can do: add a model, fix the checksum."""
    with engine.begin() as conn:
        row = dict(conn.execute(select(snapshots_table).where(snapshots_table.c.id == snapshot))
                   .one()._mapping)  # fmt: skip
        models = json.loads(row["models"])
        models.append(json.loads(model("forged").model_dump_json()))
        row["models"] = json.dumps(models)
        row["model_count"] = len(models)
        row["checksum"] = _checksum(row)
        conn.execute(
            update(snapshots_table)
            .where(snapshots_table.c.id == snapshot)
            .values(models=row["models"], model_count=row["model_count"], checksum=row["checksum"])
        )


def _events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


def test_verify_names_a_snapshot_holding_a_model_no_event_added(engine: Engine) -> None:
    snapshot = _logged(engine)
    store = open_log(engine)
    assert [c.ok for c in audit_snapshots(store, DECLARED, CONFIG)] == [True]
    _forge(engine, snapshot)
    # Without a key, start-up cannot tell: the forged model is served (README: Hostile input).
    assert "forged" in _service(engine).catalog()
    (check,) = audit_snapshots(store, DECLARED, CONFIG)
    assert not check.ok and check.snapshot == snapshot and check.position == 3
    assert "holds model 'forged', which no event up to position 3 added" in (check.problem or "")


def test_verify_checks_every_snapshot_at_its_own_position(engine: Engine) -> None:
    first = _logged(engine)
    writer = _service(engine)
    writer.add([model("d")])
    writer.remove("a")
    second = writer.snapshot()
    assert second is not None
    _forge(engine, first)
    checks = audit_snapshots(open_log(engine), DECLARED, CONFIG)
    assert [(c.snapshot, c.position, c.ok) for c in checks] == [
        (first, 3, False),
        (second, 5, True),
    ]


def test_a_keyed_start_up_refuses_a_forged_snapshot_and_rebuilds_by_replay(
    engine: Engine,
) -> None:
    snapshot = _logged(engine, KEY)
    _forge(engine, snapshot)
    restarted = _service(engine, KEY)
    with capture_logs() as logs:
        catalog = restarted.catalog()
    (refused,) = _events(logs, "catalog.snapshot_refused")
    assert refused["snapshot"] == snapshot
    assert "MAC does not match" in refused["reason"]
    assert not _events(logs, "catalog.snapshot_restored")
    assert "forged" not in catalog
    assert catalog == replay(DECLARED, open_log(engine).read(), CONFIG).catalog
    replacement = restarted.snapshot()
    assert replacement is not None
    assert "forged" not in _service(engine, KEY).catalog(), "the next snapshot is clean"
    checks = audit_snapshots(open_log(engine), DECLARED, CONFIG, KEY)
    assert [c.ok for c in checks if c.snapshot == replacement] == [True]


def test_a_keyed_start_up_refuses_a_snapshot_taken_without_the_key(engine: Engine) -> None:
    _logged(engine)
    with capture_logs() as logs:
        _service(engine, KEY).catalog()
    (refused,) = _events(logs, "catalog.snapshot_refused")
    assert "carries no MAC" in refused["reason"]


def test_a_snapshot_taken_with_the_key_is_restored_with_it_and_refused_under_another(
    engine: Engine,
) -> None:
    _logged(engine, KEY)
    with capture_logs() as logs:
        _service(engine, KEY).catalog()
    assert _events(logs, "catalog.snapshot_restored")
    with capture_logs() as logs:
        _service(engine, b"another key, also long enough").catalog()
    assert _events(logs, "catalog.snapshot_refused")
    assert not _events(logs, "catalog.snapshot_restored")
