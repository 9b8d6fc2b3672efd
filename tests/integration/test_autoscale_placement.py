"""The autoscaler's counts go through placement as it is: within min..max, surge-first,
priorities and preemption. A low-priority model's scale-up never evicts a higher one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from autoscale.policy import parse_policy
from autoscale.store import DECISION, AutoscaleStore
from catalog import Catalog
from events.catalog_service import CatalogService
from events.storage.backends import open_log
from llmgw import autoscaling
from scheduler.daemon.round_runner import Placer
from scheduler.persistence.store import SchedulerStore
from scheduler.planner.fleet.inventory import parse_node_report
from tests.support import model

T0 = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
POLICY = parse_policy({})


def _decide(engine: Engine, name: str, wanted: int, at: datetime) -> None:
    store = AutoscaleStore(engine)
    with engine.begin() as conn:
        store.append(conn, DECISION, name, {"current": 1, "wanted": wanted, "code": "load"}, at=at)


def _cluster(engine: Engine, gpus: int) -> Placer:
    declared = Catalog.build(
        [
            model("high", tp=1, scaling={"min": 2, "max": 4}, placement={"priority": 10}),
            model("low", tp=1, scaling={"min": 1, "max": 8}),
        ]
    )
    store = SchedulerStore(engine)
    store.report(
        [parse_node_report({"name": "n1", "gpu_class": "A100", "gpus": gpus, "memory_gb": 512})],
        T0,
    )
    return Placer(
        CatalogService(open_log(engine), declared),
        store,
        wanted=autoscaling.wanted(engine, POLICY),
    )


def _counts(placer: Placer) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in placer.store.state().placements:
        out[p.model] = out.get(p.model, 0) + 1
    return out


def test_wanted_counts_are_placed_and_always_held_within_min_and_max(engine: Engine) -> None:
    placer = _cluster(engine, 16)
    placer.run(now=T0)
    assert _counts(placer) == {"high": 2, "low": 1}
    _decide(engine, "low", 5, T0)
    placer.run(now=T0 + timedelta(seconds=1))
    assert _counts(placer) == {"high": 2, "low": 5}
    _decide(engine, "low", 50, T0 + timedelta(seconds=2))  # beyond max: held to 8
    _decide(engine, "high", 0, T0 + timedelta(seconds=2))  # below min: held to 2
    placer.run(now=T0 + timedelta(seconds=3))
    assert _counts(placer) == {"high": 2, "low": 8}


def test_a_low_priority_scale_up_on_a_full_cluster_never_evicts_a_higher_one(
    engine: Engine,
) -> None:
    placer = _cluster(engine, 4)
    _decide(engine, "high", 3, T0)
    placer.run(now=T0)
    assert _counts(placer) == {"high": 3, "low": 1}
    _decide(engine, "low", 8, T0 + timedelta(seconds=1))
    outcome = placer.run(now=T0 + timedelta(seconds=2))
    assert _counts(placer) == {"high": 3, "low": 1}
    assert not outcome.plan.remove
    assert {u.model for u in outcome.plan.unplaced} == {"low"}
    # The higher one scaling up on the full cluster takes the lower one's card.
    _decide(engine, "high", 4, T0 + timedelta(seconds=3))
    outcome = placer.run(now=T0 + timedelta(seconds=4))
    assert _counts(placer) == {"high": 4}
    assert any("preempted by high" in r.reason for r in outcome.plan.remove)


def test_a_model_opted_out_keeps_scaling_min_whatever_was_decided(engine: Engine) -> None:
    declared = Catalog.build([model("low", tp=1, scaling={"min": 1, "max": 8})])
    store = SchedulerStore(engine)
    store.report(
        [parse_node_report({"name": "n1", "gpu_class": "A100", "gpus": 8, "memory_gb": 512})], T0
    )
    _decide(engine, "low", 6, T0)
    off = parse_policy({"models": {"low": {"enabled": False}}})
    placer = Placer(
        CatalogService(open_log(engine), declared), store, wanted=autoscaling.wanted(engine, off)
    )
    placer.run(now=T0)
    assert _counts(placer) == {"low": 1}
