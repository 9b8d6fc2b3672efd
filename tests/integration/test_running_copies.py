"""A node given up and back, on both back ends: the engines it still runs are stored from
its report, and the next round places their replicas again there, ready, recorded with
the round so that it plans again the same."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

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
LOST = T0 + timedelta(minutes=10)  # beyond the default 90 s + 5 min


def report(name: str, replicas: list[dict[str, Any]] | None = None, gpus: int = 8) -> Any:
    raw: dict[str, Any] = {"name": name, "gpu_class": "A100", "gpus": gpus, "address": name}
    if replicas is not None:
        raw["replicas"] = replicas
    return parse_node_report(raw)


def test_a_returning_nodes_engines_are_placed_again_there_ready(engine: Engine) -> None:
    store = SchedulerStore(engine)
    # n2 has too few cards for a replica: given n1 up, nothing else takes them.
    store.report([report("n1"), report("n2", gpus=2)], T0)
    declared = Catalog.build([model("llama", tp=4, scaling={"min": 2})])
    catalog = CatalogService(open_log(engine), declared)
    placer = Placer(catalog, store)
    placer.run(now=T0)
    before = {p.replica: p for p, _ in store.replicas()}
    assert {p.nodes for p in before.values()} == {("n1",)}
    running = [
        {
            "model": "llama",
            "replica": r,
            "state": "ready",
            "endpoint": f"http://n1:{8000 + r}",
            "version": p.version,
            "profile": p.profile,
        }
        for r, p in sorted(before.items())
    ]

    # n1 silent for longer than stale_after + grace: given up, its replicas unplaced.
    store.report([report("n2", gpus=2)], LOST)
    placer.run(now=LOST)
    assert store.replicas() == []

    # Back: its report names engines of replicas placed nowhere. They are stored...
    store.report([report("n1", running), report("n2", gpus=2)], LOST + timedelta(seconds=1))
    copies = store.state().lifecycle.running
    assert [(c.node, c.model, c.replica, c.state) for c in copies] == [
        ("n1", "llama", 0, "ready"),
        ("n1", "llama", 1, "ready"),
    ]
    # ...and the next round places them again there, as their engines run: ready.
    outcome = placer.run(now=LOST + timedelta(seconds=2))
    after = {p.replica: (p, s) for p, s in store.replicas()}
    for r, p in before.items():
        again, status = after[r]
        assert (again.nodes, again.profile, again.version) == (p.nodes, p.profile, p.version)
        assert (status.state, status.endpoint) == ("ready", f"http://n1:{8000 + r}")
    reasons = [e.reason for e in store.events() if e.type == "placement.placed"][-2:]
    assert len(reasons) == 2
    assert all("placed again on n1, where its engine still runs" in x for x in reasons)

    # Recorded with the round: planned again from its record, the same plan.
    assert outcome.round_id is not None
    recorded = store.recorded_round(round_id=outcome.round_id)
    assert recorded is not None and recorded.lifecycle.running == copies
    replayed = plan(
        demands(catalog.catalog()),
        recorded.nodes,
        recorded.current,
        recorded.planned_at,
        recorded.policy,
        lifecycle=recorded.lifecycle,
    )
    assert replayed.place == outcome.plan.place

    # The node's next report, of placed replicas only, clears what it ran unplaced.
    store.report([report("n1", running)], LOST + timedelta(seconds=3))
    assert store.state().lifecycle.running == ()


def test_a_forgotten_node_takes_what_it_ran_unplaced_with_it(engine: Engine) -> None:
    store = SchedulerStore(engine)
    ghost = {"model": "llama", "replica": 0, "state": "ready", "version": "ab", "profile": "p"}
    store.report([report("n1", [ghost])], T0)
    assert [c.node for c in store.state().lifecycle.running] == ["n1"]
    assert store.forget("n1")
    assert store.state().lifecycle.running == ()
