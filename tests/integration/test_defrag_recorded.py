"""Defragmentation through the store: moves written, recorded, and planned again the same.

A real database (SQLite and PostgreSQL): rounds run by ``Placer`` as the daemon runs them,
replica states reported between rounds as agents report them. Each recorded round,
planned again from its recorded inputs, gives exactly the moves and events it wrote.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from catalog import Catalog
from events.catalog_service import CatalogService
from events.read.replay import replay
from events.storage.backends import open_log
from scheduler.daemon.round_runner import Placer
from scheduler.persistence.store import PLACED, REMOVED, UPDATED, SchedulerStore
from scheduler.planner.fleet.inventory import parse_node_report
from scheduler.planner.replica_stories import explain
from tests.support import model

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NODES = [f"n{i}" for i in range(4)]


def _report(store: SchedulerStore, at: datetime) -> None:
    store.report(
        [parse_node_report({"name": n, "gpu_class": "T4", "gpus": 4}) for n in NODES],
        at,
    )


def _ready_all(store: SchedulerStore, engine: Engine, at: datetime) -> None:
    """Every placed replica reports ready, as its agent would between rounds."""
    from scheduler.persistence.tables import PlacementRow, table

    with engine.begin() as conn:
        conn.execute(table(PlacementRow).update().values(state="ready", state_since=at))


def test_moves_are_written_surge_first_and_each_round_plans_again_to_what_it_wrote(
    engine: Engine,
) -> None:
    declared = Catalog.build([model("small", gpu_class="T4", tp=1, scaling={"min": 12})])
    events = open_log(engine)
    service = CatalogService(events, declared)
    store = SchedulerStore(engine)
    placer = Placer(service, store)
    at = T0
    _report(store, at)
    placer.run(now=at)  # 12 one-card replicas, 3 a node: one card free on each
    _ready_all(store, engine, at)
    service.add([model("big", gpu_class="T4", tp=4, scaling={"min": 1})])
    outcomes = []
    for _ in range(4):
        at += timedelta(seconds=10)
        _report(store, at)
        outcomes.append(placer.run(now=at))
        _ready_all(store, engine, at)
    started, finished = outcomes[0].plan, outcomes[1].plan
    assert len(started.moves) == 3 and not started.remove
    assert len(finished.remove) == 3
    assert [p.model for p in finished.place] == ["big"]
    assert not outcomes[2].plan.changes_anything

    trail = list(store.events())
    (node,) = {m.placement.nodes[0] for m in started.moves}
    reason = f"to make room for model big, profile main on node {node}"
    assert {m.reason for m in started.moves} == {reason}
    marked = [e for e in trail if e.type == UPDATED]
    assert len(marked) == 3 and all(reason in e.reason for e in marked)
    copies = [e for e in trail if e.type == PLACED and e.model == "small" and reason in e.reason]
    assert len(copies) == 3
    gone = [e for e in trail if e.type == REMOVED and e.model == "small"]
    assert len(gone) == 3 and all(reason in e.reason for e in gone)
    assert max(e.position for e in copies) < min(e.position for e in gone)

    for outcome in outcomes[:2]:
        assert outcome.round_id is not None
        recorded = store.recorded_round(round_id=outcome.round_id)
        assert recorded is not None
        assert recorded.policy.defragment is True
        catalog = replay(declared, events.read(until=recorded.catalog_position)).catalog
        again = explain(
            "big",
            catalog=catalog,
            nodes=recorded.nodes,
            current=recorded.current,
            now=recorded.planned_at,
            policy=recorded.policy,
            lifecycle=recorded.lifecycle,
        ).plan
        assert again.moves == outcome.plan.moves
        written = {
            (e.type, e.model, e.replica, e.nodes)
            for e in trail
            if e.round_id == outcome.round_id and e.type in (PLACED, REMOVED)
        }
        replanned = {(PLACED, p.model, p.replica, p.nodes) for p in again.place} | {
            (REMOVED, r.placement.model, r.placement.replica, r.placement.nodes)
            for r in again.remove
        }
        assert replanned == written
