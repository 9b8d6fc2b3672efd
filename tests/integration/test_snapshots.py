"""Snapshots: start-up replays only what follows one, and never trusts one that does not belong."""

from __future__ import annotations

import hashlib
from collections.abc import MutableMapping
from typing import Any

import pytest
from sqlalchemy import Engine, Table, func, select, update
from structlog.testing import capture_logs

from catalog import Catalog
from events.catalog_service import CatalogService
from events.database.tables import EventRow, SnapshotRow
from events.read.replay import replay
from events.read.snapshots import KEEP, SnapshotStore
from events.storage.backends import open_log
from tests.support import insert_raw_event, model

# SQLAlchemy types __table__ as a FromClause; a declarative table is a Table.
snapshots_table: Table = SnapshotRow.__table__  # type: ignore[assignment]
events_table: Table = EventRow.__table__  # type: ignore[assignment]
CONFIG = "deploy/catalog.yaml"
DECLARED = Catalog.build([model("llama-70b", aliases=["llama"]), model("qwen-7b")])


def _service(engine: Engine, declared: Catalog = DECLARED, every: int | None = 5) -> CatalogService:
    return CatalogService(open_log(engine), declared, CONFIG, snapshot_every=every)


def _history(engine: Engine) -> None:
    """Twelve events with adds, fallbacks, aliases and removals, and no snapshot yet."""
    writer = _service(engine, every=None)
    for i in range(8):
        fallbacks = ["llama"] if i % 3 == 0 else [f"m{i - 1}"] if i else None
        writer.add([model(f"m{i}", aliases=[f"alias-{i}"], fallbacks=fallbacks)], actor="a")
    writer.remove("m7")
    writer.remove("m6")
    writer.add([model("late", fallbacks=["m5"])])
    writer.remove("late")


def _full(engine: Engine, declared: Catalog = DECLARED) -> Catalog:
    return replay(declared, open_log(engine).read(), CONFIG).catalog


def _events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


def _snapshot_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(snapshots_table)).scalar_one())


def test_a_restored_service_has_exactly_the_catalog_of_a_full_replay(engine: Engine) -> None:
    _history(engine)
    first = _service(engine)
    with capture_logs() as logs:
        first.refresh()
    assert _events(logs, "catalog.snapshot_taken")[0]["position"] == 12
    restarted = _service(engine)
    with capture_logs() as logs:
        catalog = restarted.catalog()
    (restored,) = _events(logs, "catalog.snapshot_restored")
    assert restored["position"] == 12
    assert catalog == _full(engine)  # the same models, in the same order
    assert catalog.models() == _full(engine).models()
    assert restarted.refresh().applied == ()  # nothing replayed after the snapshot


def test_a_restored_service_continues_exactly_as_a_full_replay_would(engine: Engine) -> None:
    _history(engine)
    _service(engine).snapshot()
    restored = _service(engine)
    restored.add([model("after", fallbacks=["m5"], aliases=["aft"])])
    with pytest.raises(Exception, match="cannot be removed"):
        restored.remove("m5")
    restored.remove("after")
    restored.remove("m5")
    assert restored.catalog() == _full(engine)


def test_skipped_counts_survive_a_snapshot(engine: Engine) -> None:
    insert_raw_event(engine, 1, payload="{torn")
    _service(engine).add([model("ok")])
    _service(engine).snapshot()
    restarted = _service(engine)
    restarted.refresh()
    assert restarted.replayer.skipped_count == 1
    assert restarted.replayer.applied_count == 1


def test_a_snapshot_built_under_one_catalog_yaml_is_not_used_under_another(
    engine: Engine,
) -> None:
    _history(engine)
    _service(engine).snapshot()
    # m3 was added at runtime; now it is declared: its runtime events must be judged again.
    changed = Catalog.build([*DECLARED.models(), model("m3", gpu_class="H100")])
    other = _service(engine, declared=changed)
    with capture_logs() as logs:
        catalog = other.catalog()
    (ignored,) = _events(logs, "catalog.snapshot_ignored")
    assert "declared configuration changed" in ignored["reason"]
    assert not _events(logs, "catalog.snapshot_restored")
    assert catalog == _full(engine, changed)
    m3 = catalog.resolve("m3")
    assert m3 is not None and m3.profiles[0].gpu_class == "H100"
    # It replaced the stale snapshot after catching up; the next start uses that one.
    with capture_logs() as logs:
        _service(engine, declared=changed).catalog()
    assert _events(logs, "catalog.snapshot_restored")
    assert not _events(logs, "catalog.snapshot_ignored")
    # And the first configuration's snapshot is still there for the first configuration.
    with capture_logs() as logs:
        assert _service(engine).catalog() == _full(engine)
    assert _events(logs, "catalog.snapshot_restored")


def _newest(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.max(snapshots_table.c.id))).scalar_one())


def _checksum_for(engine: Engine, snapshot_id: int, models: str) -> str:
    from events.read.snapshots import _checksum

    with engine.connect() as conn:
        row = conn.execute(select(snapshots_table).where(snapshots_table.c.id == snapshot_id)).one()
    return _checksum({**row._mapping, "models": models})


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("edited", "checksum mismatch"),
        ("bad_json", "models cannot be read"),
        ("rewritten_log", "the log was rewritten"),
    ],
)
def test_a_damaged_snapshot_is_ignored_named_and_never_trusted(
    engine: Engine, damage: str, reason: str
) -> None:
    _history(engine)
    _service(engine).snapshot()
    snapshot_id = _newest(engine)
    with engine.begin() as conn:
        row = conn.execute(select(snapshots_table).where(snapshots_table.c.id == snapshot_id)).one()
        if damage == "edited":
            # A model slipped in by hand: valid JSON, but not what was written.
            models = row.models.replace('"m0"', '"m0-evil"', 1)
            values: dict[str, Any] = {"models": models}
        elif damage == "bad_json":
            models = row.models[:-5]
            values = {"models": models, "checksum": _checksum_for(engine, snapshot_id, models)}
        else:
            values = {}
            conn.execute(
                update(events_table)
                .where(events_table.c.position == row.position)
                .values(hash=hashlib.sha256(b"another history").hexdigest())
            )
        if values:
            conn.execute(
                update(snapshots_table).where(snapshots_table.c.id == snapshot_id).values(**values)
            )
    with capture_logs() as logs:
        catalog = _service(engine).catalog()
    (ignored,) = _events(logs, "catalog.snapshot_ignored")
    assert reason in ignored["reason"]
    assert ignored["snapshot"] == snapshot_id
    assert not _events(logs, "catalog.snapshot_restored")
    assert catalog == _full(engine)
    assert "m0-evil" not in catalog


def test_snapshots_are_taken_every_n_events_and_only_the_newest_are_kept(
    engine: Engine,
) -> None:
    service = _service(engine, every=2)
    for i in range(2 * (KEEP + 2)):
        service.add([model(f"m{i}")])
    assert _snapshot_count(engine) == KEEP
    positions = [s.position for s in SnapshotStore(engine).taken()]
    assert positions == sorted(positions) and positions[-1] == service.position


def test_a_service_without_snapshots_neither_reads_nor_writes_them(engine: Engine) -> None:
    _history(engine)
    _service(engine).snapshot()
    with capture_logs() as logs:
        catalog = _service(engine, every=None).catalog()
    assert not _events(logs, "catalog.snapshot_restored")
    assert catalog == _full(engine)
    count = _snapshot_count(engine)
    service = _service(engine, every=None)
    for i in range(12):
        service.add([model(f"extra-{i}")])
    assert _snapshot_count(engine) == count
