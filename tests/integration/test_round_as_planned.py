"""A round after a write compares its kept placements with the ones its planner held.

The placements a round wrote are read back by the next as new objects; the planner takes
its own plan's objects for them (``IncrementalRounds.held_for``) and its plan keeps those.
The placer gives ``apply`` and ``_pinned_now`` those same objects as the placements the
plan is based on, so that the kept ones are found by identity rather than by an index of
every placement by slot (0.3-0.6 s of a lost node's round at 170,000 placements)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from catalog import Catalog
from events.catalog_service import CatalogService
from events.database.connection import make_engine
from events.storage.backends import open_log
from scheduler.daemon.round_runner import Placer
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.store import SchedulerStore
from scheduler.planner.fleet.inventory import parse_node_report
from scheduler.planner.fleet.placements import not_among
from tests.support import model

POLICY = StalenessPolicy(stale_after=timedelta(seconds=15), grace=timedelta(seconds=5))


def test_the_round_after_a_write_is_based_on_the_placements_its_planner_held(
    sqlite_url: str,
) -> None:
    engine = make_engine(sqlite_url)
    try:
        store = SchedulerStore(engine)
        now = datetime.now(UTC)
        names = ("n1", "n2", "n3")
        reports = [
            parse_node_report({"name": n, "gpu_class": "A100", "gpus": 4, "address": n})
            for n in names
        ]
        store.report(reports, now)
        declared = Catalog.build([model("llama", tp=2, scaling={"min": 4})])
        placer = Placer(CatalogService(open_log(engine), declared), store, POLICY)
        first = placer.run(now=now)
        assert first.round_id is not None and len(first.plan.place) == 4
        # n1 falls silent; the others renew their leases. The next round reads the
        # placements written back (new objects), then n1 is lost and its replicas go.
        lost = first.plan.place[0].nodes[0]
        beating = {n: n != lost for n in names}
        at = now
        outcomes = []
        for _ in range(3):
            at += timedelta(seconds=10)
            store.renew_leases({n: at for n, live in beating.items() if live})
            outcomes.append(placer.run(now=at))
        written = [o for o in outcomes if o.round_id is not None]
        assert written and written[-1].plan.remove, outcomes
        last = written[-1]
        # Based on the very objects its planner kept: the first plan's, not those read.
        assert not not_among(last.plan.keep, last.before)
        mine = {(p.model, p.replica): p for p in first.plan.placements}
        assert all(p is mine[p.model, p.replica] for p in last.before)
        assert store.state().placements == last.plan.placements
    finally:
        engine.dispose()
