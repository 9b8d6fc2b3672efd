"""Replica states reported by agents, on both back ends: recorded, evented, and bounded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine

from catalog import Catalog
from events.catalog_service import CatalogService
from events.storage.backends import open_log
from scheduler.daemon.round_runner import Placer
from scheduler.persistence.store import SchedulerStore
from scheduler.planner.demands import demands
from scheduler.planner.fleet.inventory import parse_node_report
from scheduler.planner.plan import plan
from tests.support import model

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def report(name: str, replicas: list[dict[str, Any]] | None = None, gpus: int = 8) -> Any:
    # The node's advertised address: the host its replicas' endpoints name.
    raw: dict[str, Any] = {"name": name, "gpu_class": "A100", "gpus": gpus, "address": name}
    if replicas is not None:
        raw["replicas"] = replicas
    return parse_node_report(raw)


@pytest.fixture
def placed(engine: Engine) -> SchedulerStore:
    """Two single-node replicas of llama, placed on n1 (8 GPUs, tp 4 each).

    n2 has too few GPUs for one: spread would otherwise put a replica on each.
    """
    store = SchedulerStore(engine)
    store.report([report("n1"), report("n2", gpus=2)], T0)
    declared = Catalog.build([model("llama", tp=4, scaling={"min": 2})])
    Placer(CatalogService(open_log(engine), declared), store).run(now=T0)
    return store


def states(store: SchedulerStore) -> dict[int, tuple[str, str | None]]:
    return {p.replica: (s.shown_state, s.endpoint) for p, s in store.replicas(model="llama")}


def test_replicas_of_an_agent_that_never_reports_states_count_as_unreported(
    placed: SchedulerStore,
) -> None:
    assert states(placed) == {0: ("unreported", None), 1: ("unreported", None)}


def test_a_reported_state_is_recorded_with_its_time_and_one_event_per_change(
    placed: SchedulerStore,
) -> None:
    (host,) = {p.nodes[0] for p, _ in placed.replicas()}
    placed.report([report(host, [])], T0 + timedelta(seconds=1))
    # An agent that reports replicas, having started none yet: both wait for it.
    assert states(placed) == {0: ("placed", None), 1: ("placed", None)}

    ready = {"model": "llama", "replica": 0, "state": "ready", "endpoint": "http://n1:8000"}
    starting = {"model": "llama", "replica": 1, "state": "starting", "message": "loading"}
    placed.report([report(host, [ready, starting])], T0 + timedelta(seconds=2))
    placed.report([report(host, [ready, starting])], T0 + timedelta(seconds=3))  # no change
    placed.report([report(host)], T0 + timedelta(seconds=4))  # no replicas: as they were

    assert states(placed) == {0: ("ready", "http://n1:8000"), 1: ("starting", None)}
    since = {p.replica: s.since for p, s in placed.replicas()}
    assert since == {0: T0 + timedelta(seconds=2), 1: T0 + timedelta(seconds=2)}
    events = [(e.type, e.replica, e.reason, e.actor) for e in placed.events()]
    assert events[-2:] == [
        ("replica.ready", 0, f"reported ready by node {host}", "agent"),
        ("replica.starting", 1, "loading", "agent"),
    ]


def test_a_report_about_a_replica_not_placed_on_that_node_changes_nothing(
    placed: SchedulerStore,
) -> None:
    (host,) = {p.nodes[0] for p, _ in placed.replicas()}
    other = "n2" if host == "n1" else "n1"
    before = list(placed.events())
    placed.report(
        [
            report(other, [{"model": "llama", "replica": 0, "state": "ready"}]),
            report(host, [{"model": "ghost", "replica": 0, "state": "failed"}]),
        ],
        T0 + timedelta(seconds=1),
    )
    # Both agents now report replicas, and neither reported this one as its own.
    assert states(placed)[0] == ("placed", None)
    assert list(placed.events()) == before


def test_a_placement_listing_filters_by_node_and_model(placed: SchedulerStore) -> None:
    (host,) = {p.nodes[0] for p, _ in placed.replicas()}
    assert len(placed.replicas(node=host)) == 2
    assert placed.replicas(node="nowhere") == []
    assert placed.replicas(model="other") == []


def test_a_timed_out_replica_is_failed_recorded_and_its_round_plans_again_the_same(
    engine: Engine,
) -> None:
    store = SchedulerStore(engine)
    store.report([report("n1", []), report("n2", [])], T0)
    definition = model("llama", tp=4, scaling={"min": 1})
    service = CatalogService(open_log(engine), Catalog.build([definition]))
    placer = Placer(service, store)
    placer.run(now=T0)
    ((first, _),) = store.replicas()
    later = T0 + timedelta(minutes=21)  # the default startup timeout is 20 minutes
    store.report([report("n1", []), report("n2", [])], later)

    outcome = placer.run(now=later)

    (failure,) = outcome.plan.failures
    assert failure.reason == "startup timeout"
    ((again, status),) = store.replicas()
    assert again.nodes != first.nodes and status.state == "placed"
    (record,) = store.state().lifecycle.failures
    assert (record.model, record.node, record.failures) == ("llama", first.nodes[0], 1)
    types = [e.type for e in store.events(round_id=outcome.round_id)]
    assert types == ["replica.failed", "placement.removed", "placement.placed"]

    recorded = store.recorded_round(round_id=outcome.round_id)
    assert recorded is not None
    replanned = plan(
        demands(service.catalog()),
        list(recorded.nodes),
        recorded.current,
        recorded.planned_at,
        recorded.policy,
        lifecycle=recorded.lifecycle,
    )
    assert replanned == outcome.plan


def test_cordons_are_stored_with_actor_and_reason_and_are_events(engine: Engine) -> None:
    store = SchedulerStore(engine)
    store.report([report("n1")], T0)
    assert store.cordon("n1", "draining", actor="alice", reason="kernel update") is None
    before = store.cordon("n1", "draining", actor="bob", reason="again")  # no change
    assert before is not None and before.actor == "alice"
    store.cordon("n1", None, actor="carol", reason="done")
    events = [(e.type, e.nodes, e.actor, e.reason) for e in store.events()]
    assert events == [
        ("node.draining", ("n1",), "alice", "kernel update"),
        ("node.uncordoned", ("n1",), "carol", "done"),
    ]
    assert store.state().lifecycle.cordons == {}
