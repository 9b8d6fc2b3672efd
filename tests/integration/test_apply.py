"""Apply through the log, on both back ends: one event per replacement, every reader in step.

A replacement is appended as one ``model.replaced`` event after the whole
catalog is judged; what it changed reads the same in history, time travel,
diff, verify, snapshots and a full replay; an older release's log takes one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sqlalchemy import Engine

from catalog import Catalog, CatalogError, load_declared
from catalog.changes.diff import diff_catalogs
from events.catalog_service import CatalogService
from events.core.chain import verify_chain
from events.database.connection import make_engine
from events.database.migrate import upgrade
from events.read.replay import replay
from events.read.snapshots import SnapshotStore
from events.read.time_travel import catalog_at, catalogs_at
from events.storage.backends import open_log
from events.storage.chain_rows import read_chain, read_seal
from events.storage.history import HistoryQuery, history
from events.write.commands import KeyReused
from tests.support import model

CONFIG = "deploy/catalog.yaml"
DECLARED = Catalog.build([model("llama-70b", aliases=["llama"]), model("qwen-7b")])
DATA = Path(__file__).resolve().parent.parent / "data"


@pytest.fixture
def service(engine: Engine) -> CatalogService:
    return CatalogService(open_log(engine), DECLARED, CONFIG, snapshot_every=None)


def test_apply_adds_then_replaces_in_one_event_then_writes_nothing_when_unchanged(
    service: CatalogService,
) -> None:
    added = service.apply(model("trial", aliases=["t"]), actor="alice", reason="try")
    assert (added.outcome, added.position) == ("added", 1)
    assert added.diff().to_json() == {"added": ["trial"], "removed": [], "changed": []}

    replaced = service.apply(model("trial", aliases=["t"], tp=2), actor="alice", reason="tp2")
    assert (replaced.outcome, replaced.position) == ("replaced", 2)
    assert [c.to_json() for c in replaced.changes] == [
        {"path": "profiles[main].tp", "before": 1, "after": 2},
        {"path": "profiles[main].gpus_per_node", "before": 1, "after": 2},
    ]
    (event,) = replaced.events
    assert (event.type, event.model, event.actor, event.reason) == (
        "model.replaced", "trial", "alice", "tp2",
    )  # fmt: skip

    same = service.apply(model("trial", aliases=["t"], tp=2))
    assert (same.outcome, same.events, same.position) == ("unchanged", (), None)
    assert service.store.head() == 2
    trial = service.catalog().resolve("t")
    assert trial is not None
    assert trial.profiles[0].tp == 2


def test_a_refused_apply_writes_nothing_and_names_what_to_do(service: CatalogService) -> None:
    service.apply(model("trial", aliases=["t"]))
    service.apply(model("dep", fallbacks=["t"]))
    with pytest.raises(CatalogError) as declared:
        service.apply(model("qwen-7b", tp=2))
    assert f"Change it in {CONFIG} instead" in str(declared.value)
    with pytest.raises(CatalogError, match="'dep' falls back to it"):
        service.apply(model("trial"))
    with pytest.raises(CatalogError, match="alias 'llama' is already the alias of declared"):
        service.apply(model("trial", aliases=["t", "llama"]))
    with pytest.raises(CatalogError, match="fallback 'nope' is not in the catalog"):
        service.apply(model("trial", aliases=["t"], fallbacks=["nope"]))
    with pytest.raises(CatalogError, match="the name is already the alias of model 'trial'"):
        service.apply(model("t"))
    assert service.store.head() == 2


def test_a_key_repeats_the_first_outcome_and_refuses_a_different_change(
    service: CatalogService, engine: Engine
) -> None:
    service.apply(model("trial"))
    first = service.apply(model("trial", tp=2), key="k-1")
    # A retry, even from a process that never saw the first attempt, reports it.
    other = CatalogService(open_log(engine), DECLARED, CONFIG, snapshot_every=None)
    again = other.apply(model("trial", tp=2), key="k-1")
    assert again.already_recorded and again.outcome == "replaced"
    assert again.events == first.events and again.changes == first.changes
    with pytest.raises(KeyReused, match="'k-1' was already used for a different change"):
        other.apply(model("trial", tp=4), key="k-1")
    with pytest.raises(KeyReused):
        other.add([model("trial")], key="k-1")
    assert service.store.head() == 2


def test_history_time_travel_diff_verify_and_snapshots_read_a_replacement(
    service: CatalogService, engine: Engine
) -> None:
    service.apply(model("trial", aliases=["t"]), actor="alice")
    service.apply(model("other", fallbacks=["llama"]), actor="bob")
    # 'trial' was accepted first and now falls back to 'other', accepted after it.
    service.apply(model("trial", aliases=["t", "t2"], fallbacks=["other"]), actor="carol")
    store = service.store

    replaced = list(history(store.engine, HistoryQuery(model="trial", type="model.replaced")))
    assert [(e.position, e.actor) for e in replaced] == [(3, "carol")]

    before, after = catalogs_at(store, DECLARED, [2, 3], config_path=CONFIG)
    diff = diff_catalogs(before, after)
    assert [c.name for c in diff.changed] == ["trial"]
    assert [c.path for c in diff.changed[0].changes] == ["aliases", "fallbacks"]
    assert catalog_at(store, DECLARED, 2, config_path=CONFIG)[1].resolve("t2") is None

    report = verify_chain(read_chain(store.engine), read_seal(store.engine))
    assert report.ok and report.head_position == 3

    # A snapshot after the replacement restores (the forward fallback included) to
    # exactly the catalog of a full replay, and time travel starts from it.
    assert service.snapshot() is not None
    restarted = CatalogService(open_log(engine), DECLARED, CONFIG)
    assert restarted.catalog() == replay(DECLARED, store.read(), CONFIG).catalog
    assert restarted.catalog().fallbacks_of("trial") == ("other",)
    _, at = catalog_at(store, DECLARED, 3, config_path=CONFIG, snapshots=SnapshotStore(engine))
    assert at == restarted.catalog()


def test_a_replacement_appended_to_the_first_releases_log_replays(tmp_path: Path) -> None:
    copy = tmp_path / "v1.sqlite"
    shutil.copy(DATA / "catalog_v1.sqlite", copy)
    engine = make_engine(f"sqlite:///{copy}")
    upgrade(engine)
    declared = load_declared(DATA / "catalog_v1.yaml")
    service = CatalogService(open_log(engine), declared, str(DATA / "catalog_v1.yaml"))
    coder = service.catalog().resolve("coder")
    assert coder is not None
    new = coder.model_copy(update={"source": "Qwen/Qwen2.5-Coder-7B-Instruct-AWQ"})
    result = service.apply(new, actor="erin")
    assert result.outcome == "replaced" and result.position == 7
    full = replay(declared, service.store.read(), str(DATA / "catalog_v1.yaml"))
    assert full.skipped == () and full.applied == (1, 2, 3, 4, 5, 6, 7)
    coder = full.catalog.resolve("coder")
    assert coder is not None
    assert coder.source.endswith("-AWQ")
    assert verify_chain(read_chain(service.store.engine), read_seal(service.store.engine)).ok
    engine.dispose()
