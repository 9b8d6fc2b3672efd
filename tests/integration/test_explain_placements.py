"""Explaining a past round plans it again on exactly its inputs and gets what it wrote."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from catalog import Catalog
from events.catalog_service import CatalogService
from events.read.replay import replay
from events.storage.backends import open_log
from scheduler.daemon.round_runner import Placer
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.store import PLACED, REMOVED, SchedulerStore
from scheduler.planner.fleet.inventory import NodeReport, parse_node_report
from scheduler.planner.replica_stories import explain
from tests.support import model

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _node(name: str, gpu_class: str, gpus: int, **extra: object) -> NodeReport:
    return parse_node_report({"name": name, "gpu_class": gpu_class, "gpus": gpus, **extra})


def test_every_recorded_round_plans_again_to_exactly_what_it_wrote(engine: Engine) -> None:
    declared = Catalog.build(
        [
            model("big", gpu_class="A100", tp=8, scaling={"min": 1}),
            model(
                "small",
                scaling={"min": 3},
                profiles=[
                    {"name": "t4", "gpu_class": "T4", "tp": 2, "priority": 10},
                    {"name": "a100", "gpu_class": "A100", "tp": 2, "priority": 1},
                ],
            ),
        ]
    )
    events = open_log(engine)
    service = CatalogService(events, declared)
    store = SchedulerStore(engine)
    placer = Placer(service, store)

    # A day in the life: nodes come, a trial model is added, a node goes quiet, more nodes.
    store.report([_node("a1", "A100", 8), _node("t1", "T4", 4)], T0)
    placer.run(now=T0)
    service.add([model("trial", gpu_class="A100", tp=4, scaling={"min": 2})])
    store.report([_node("a2", "A100", 8)], T0 + timedelta(minutes=1))
    placer.run(now=T0 + timedelta(minutes=1))
    store.report(  # t1 goes quiet; the A100s keep reporting
        [_node("a1", "A100", 8), _node("a2", "A100", 8)],
        T0 + timedelta(minutes=9),
    )
    placer.run(now=T0 + timedelta(minutes=9))
    service.remove("trial")
    placer.run(now=T0 + timedelta(minutes=10))

    rounds = store.state().round_id
    assert rounds >= 3
    kinds = {e.type for e in store.events()}
    assert kinds == {PLACED, REMOVED}, "the history exercises placements and removals"
    for round_id in range(1, rounds + 1):
        recorded = store.recorded_round(round_id=round_id)
        assert recorded is not None
        catalog = replay(declared, events.read(until=recorded.catalog_position)).catalog
        written = {
            (e.type, e.model, e.replica, e.nodes)
            for e in store.events()
            if e.round_id == round_id and e.type in (PLACED, REMOVED)
        }
        again: set[tuple[str, str, int, tuple[str, ...]]] = set()
        for name in [*catalog.names(), "trial"]:
            result = explain(
                name,
                catalog=catalog,
                nodes=recorded.nodes,
                current=recorded.current,
                now=recorded.planned_at,
                policy=recorded.policy,
            )
            again |= {(PLACED, p.model, p.replica, p.nodes) for p in result.plan.place} | {
                (REMOVED, r.placement.model, r.placement.replica, r.placement.nodes)
                for r in result.plan.remove
            }
        assert again == written, f"round {round_id} planned again differs"


def test_a_replica_on_a_fallback_profile_says_why_the_better_one_did_not_fit(
    engine: Engine,
) -> None:
    declared = Catalog.build(
        [
            model(
                "small",
                scaling={"min": 2},
                profiles=[
                    {"name": "t4", "gpu_class": "T4", "tp": 2, "priority": 10},
                    {"name": "a100", "gpu_class": "A100", "tp": 2, "priority": 1},
                ],
            )
        ]
    )
    store = SchedulerStore(engine)
    placer = Placer(CatalogService(open_log(engine), declared), store)
    store.report([_node("t1", "T4", 2), _node("a1", "A100", 8)], T0)
    outcome = placer.run(now=T0)
    recorded = store.recorded_round(round_id=outcome.round_id)
    assert recorded is not None
    result = explain(
        "small",
        catalog=declared,
        nodes=recorded.nodes,
        current=recorded.current,
        now=recorded.planned_at,
        policy=recorded.policy,
    )
    stories = {s.replica: s for s in result.stories}
    assert stories[0].profile == "t4" and "better profiles" not in stories[0].why
    assert stories[1].profile == "a100"
    assert "profile t4: 0/2 nodes fit" in stories[1].why
    assert "fewer than 2 free GPUs" in stories[1].why


def test_a_round_that_preempted_explains_itself_and_records_the_switch(engine: Engine) -> None:
    trial = model("trial", tp=8, scaling={"min": 1})
    prod = model("prod", tp=8, scaling={"min": 1}, placement={"priority": 10})
    events = open_log(engine)
    service = CatalogService(events, Catalog.build([trial]))
    store = SchedulerStore(engine)
    store.report([_node("a1", "A100", 8)], T0)
    Placer(service, store).run(now=T0)
    service.add([prod])

    outcome = Placer(service, store).run(now=T0 + timedelta(seconds=10))

    assert [(r.placement.model, r.reason) for r in outcome.plan.remove] == [
        ("trial", "preempted by prod[0]")
    ]
    removed = [e for e in store.events(round_id=outcome.round_id) if e.type == REMOVED]
    assert [(e.model, e.reason) for e in removed] == [("trial", "preempted by prod[0]")]
    recorded = store.recorded_round(round_id=outcome.round_id)
    assert recorded is not None and recorded.policy.preemption
    catalog = replay(Catalog.build([trial]), events.read(until=recorded.catalog_position)).catalog
    for name in ("prod", "trial"):
        result = explain(
            name,
            catalog=catalog,
            nodes=recorded.nodes,
            current=recorded.current,
            now=recorded.planned_at,
            policy=recorded.policy,
        )
        assert result.plan.remove == outcome.plan.remove
        assert result.plan.place == outcome.plan.place
    prod_story = explain(
        "prod",
        catalog=catalog,
        nodes=recorded.nodes,
        current=recorded.current,
        now=recorded.planned_at,
        policy=recorded.policy,
    ).stories[0]
    assert "made room by evicting trial[0] (lower priority)" in prod_story.why


def test_with_preemption_switched_off_the_round_records_it_and_evicts_nothing(
    engine: Engine,
) -> None:
    trial = model("trial", tp=8, scaling={"min": 1})
    prod = model("prod", tp=8, scaling={"min": 1}, placement={"priority": 10})
    service = CatalogService(open_log(engine), Catalog.build([trial]))
    store = SchedulerStore(engine)
    off = StalenessPolicy(preemption=False)
    store.report([_node("a1", "A100", 8), _node("t1", "T4", 1)], T0)
    Placer(service, store, off).run(now=T0)
    service.add([prod, model("t4", gpu_class="T4", scaling={"min": 1})])

    outcome = Placer(service, store, off).run(now=T0 + timedelta(seconds=10))

    assert outcome.plan.remove == ()
    assert [u.model for u in outcome.plan.unplaced] == ["prod"]
    recorded = store.recorded_round(round_id=outcome.round_id)
    assert recorded is not None and recorded.policy.preemption is False
