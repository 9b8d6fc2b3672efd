"""The scheduler's storage on both back ends: reports, fenced rounds, and what a round recorded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine

from catalog import Catalog
from events.catalog_service import CatalogService
from events.storage.backends import open_log
from scheduler.daemon.round_runner import Placer
from scheduler.persistence.store import PLACED, REMOVED, RoundConflict, SchedulerStore
from scheduler.planner.demands import demands
from scheduler.planner.fleet.inventory import NodeReport, parse_node_report
from scheduler.planner.plan import plan
from tests.support import model

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _reports(*specs: tuple[str, int]) -> list[NodeReport]:
    return [
        parse_node_report(
            {
                "name": name,
                "gpu_class": "A100",
                "gpus": gpus,
                "memory_gb": 512,
                "labels": {"zone": "eu"},
                "fabric": "ib-1",
            }
        )
        for name, gpus in specs
    ]


@pytest.fixture
def placer(engine: Engine) -> Placer:
    declared = Catalog.build([model("llama", tp=4, scaling={"min": 2})])
    return Placer(CatalogService(open_log(engine), declared), SchedulerStore(engine))


def test_a_report_is_stored_with_its_arrival_time_and_a_later_report_replaces_it(
    engine: Engine,
) -> None:
    store = SchedulerStore(engine)
    store.report(_reports(("n1", 8)), T0)
    cpu = parse_node_report({"name": "cpu-1", "gpus": 0})  # memory unknown
    store.report([*_reports(("n1", 4)), cpu], T0 + timedelta(seconds=30))
    nodes = {n.name: n for n in store.nodes()}
    assert nodes["n1"].gpus == 4
    assert nodes["n1"].reported_at == T0 + timedelta(seconds=30)
    assert nodes["n1"].labels == {"zone": "eu"} and nodes["n1"].fabric == "ib-1"
    assert nodes["cpu-1"].memory_gb is None and nodes["cpu-1"].gpu_class is None
    assert store.forget("cpu-1") and not store.forget("cpu-1")


def test_a_round_records_placements_and_their_audit_trail_and_the_next_changes_nothing(
    engine: Engine, placer: Placer
) -> None:
    store = placer.store
    store.report(_reports(("n1", 8), ("n2", 8)), T0)
    first = placer.run(now=T0)
    assert first.round_id == 1
    assert [(p.model, p.replica) for p in store.state().placements] == [("llama", 0), ("llama", 1)]
    assert [e.type for e in store.events()] == [PLACED, PLACED]

    second = placer.run(now=T0 + timedelta(seconds=10))
    assert second.round_id is None  # nothing changed: nothing recorded
    assert not second.plan.changes_anything
    assert store.state().round_id == 1


def test_a_plan_made_from_an_older_state_is_refused(engine: Engine, placer: Placer) -> None:
    store = placer.store
    store.report(_reports(("n1", 8)), T0)
    stale = store.state()
    placer.run(now=T0)
    catalog = placer.catalog.catalog()
    late = plan(demands(catalog), store.nodes(), stale.placements, T0, placer.policy)
    with pytest.raises(RoundConflict):
        store.apply(
            late,
            based_on=stale,
            catalog_position=0,
            nodes=store.nodes(),
            now=T0,
            policy=placer.policy,
        )
    assert len(store.state().placements) == 2
    assert len(list(store.events())) == 2


def test_a_lost_node_gives_up_its_replicas_with_the_reason_recorded(
    engine: Engine, placer: Placer
) -> None:
    store = placer.store
    store.report(_reports(("n1", 8), ("n2", 8), ("n3", 8)), T0)
    placer.run(now=T0)
    hosting = {p.nodes[0] for p in store.state().placements}
    later = T0 + timedelta(minutes=10)
    alive = [n for n in ("n1", "n2", "n3") if n not in hosting] + sorted(hosting)[1:]
    store.report(_reports(*((n, 8) for n in alive)), later)
    outcome = placer.run(now=later)
    removed = [e for e in store.events() if e.type == REMOVED]
    assert removed and all("lost" in e.reason for e in removed)
    assert outcome.plan.place
    assert len(store.state().placements) == 2


def test_a_recorded_round_holds_exactly_what_its_plan_was_made_from(
    engine: Engine, placer: Placer
) -> None:
    store = placer.store
    store.report(_reports(("n1", 8), ("n2", 2)), T0)
    outcome = placer.run(now=T0)
    recorded = store.recorded_round(round_id=outcome.round_id)
    assert recorded is not None
    assert recorded.catalog_position == outcome.catalog_position
    catalog = placer.catalog.catalog()
    again = plan(
        demands(catalog), recorded.nodes, recorded.current, recorded.planned_at, recorded.policy
    )
    assert again == outcome.plan
    assert store.recorded_round(at=T0 - timedelta(seconds=1)) is None
    assert store.recorded_round(at=T0) == recorded
