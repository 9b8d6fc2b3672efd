"""Pinned versions on SQLite and PostgreSQL: a round records each version's definition,
and the engine view of a placement is its version's, whatever the catalog became.

Real databases, real migrations, the real placer and catalog service; and a hostile
``model_versions`` row is skipped and named, never served as something to run.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, update

from catalog import Catalog, parse_model
from catalog.changes.digest import model_version
from events.catalog_service import CatalogService
from events.storage.backends import open_log
from scheduler.daemon.round_runner import Placer
from scheduler.persistence.store import SchedulerStore
from scheduler.persistence.versions import VersionBook, versions_t
from scheduler.planner.fleet.inventory import NodeReport


def trial(args: list[str]) -> dict[str, object]:
    return {
        "name": "trial",
        "source": "org/trial",
        "scaling": {"min": 1},
        "profiles": [{"name": "a100", "gpu_class": "A100", "args": args}],
    }


@pytest.fixture
def setup(engine: Engine) -> tuple[CatalogService, SchedulerStore]:
    service = CatalogService(open_log(engine), Catalog.build([]))
    store = SchedulerStore(engine)
    store.report([NodeReport(name="n1", gpu_class="A100", gpus=4)], datetime.now(UTC))
    return service, store


def test_a_placement_keeps_its_versions_engine_view_after_the_catalog_changes(
    setup: tuple[CatalogService, SchedulerStore], engine: Engine
) -> None:
    service, store = setup
    service.add([parse_model(trial(["--v", "1"]))])
    placer = Placer(service, store)
    placer.run()
    ((p, _),) = store.replicas(model="trial")
    first = service.catalog().resolve("trial")
    assert first is not None and p.version == model_version(first)

    service.apply(parse_model(trial(["--v", "2"])))
    now = service.catalog()
    # Another process (a fresh book, no cache) reads the pinned definition back.
    view = VersionBook(engine).engine_view(p, now)
    assert view is not None and view.args == ("--v", "1")
    # The current catalog's view would have been the new one: that is what pinning avoids.
    current = now.resolve("trial")
    assert current is not None
    engine_view = current.engine_profile("a100")
    assert engine_view is not None
    assert engine_view.args == ("--v", "2")

    # The next rounds place the new version beside it (surge-first) and record it too.
    placer.run()
    versions = {q.version for q, _ in store.replicas(model="trial")}
    assert versions == {p.version, model_version(current)}
    book = VersionBook(engine)
    for q, _ in store.replicas(model="trial"):
        shown = book.engine_view(q, now)
        assert shown is not None
        assert shown.args == (("--v", "1") if q.version == p.version else ("--v", "2"))


def test_a_hostile_version_row_is_skipped_and_named_not_served(
    setup: tuple[CatalogService, SchedulerStore],
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
) -> None:
    service, store = setup
    service.add([parse_model(trial(["--v", "1"]))])
    Placer(service, store).run()
    ((p, _),) = store.replicas(model="trial")
    service.apply(parse_model(trial(["--v", "2"])))
    for hostile in ("[" * 5000, '{"name": "other", "source": "x", "profiles": []}', "not json"):
        with engine.begin() as conn:
            conn.execute(update(versions_t).values(definition=hostile))
        # None: the agent neither starts nor restarts anything for it.
        assert VersionBook(engine).engine_view(p, service.catalog()) is None
        assert "model_versions" in capsys.readouterr().out


def test_a_report_of_another_version_than_the_slot_holds_is_ignored(
    setup: tuple[CatalogService, SchedulerStore],
) -> None:
    """A slot given to a new replica on the same node: the old engine's last report (of the
    old version) must not mark the new replica ready, as it would let a rollout stop the
    next old replica while the new one still loads."""
    from scheduler.planner.fleet.inventory import parse_node_report

    service, store = setup
    service.add([parse_model(trial(["--v", "1"]))])
    Placer(service, store).run()
    ((p, status),) = store.replicas(model="trial")
    assert status.state == "placed"

    def report(version: str) -> str:
        body = {
            "name": "n1",
            "gpu_class": "A100",
            "gpus": 4,
            "replicas": [
                {"model": "trial", "replica": p.replica, "state": "ready", "version": version}
            ],
        }
        store.report([parse_node_report(body)], datetime.now(UTC))
        ((_, now),) = store.replicas(model="trial")
        return now.state

    assert report("0123456789abcdef0123456789abcdef") == "placed"  # another version
    assert report(p.version) == "ready"
