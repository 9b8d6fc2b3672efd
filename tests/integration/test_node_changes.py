"""A round reads the nodes that changed, not every node, on both back ends (issue 42).

A report moves a node's ``changed_at`` only when what the planner reads of it changed;
a heartbeat never does. A placer's feed then reads, after its first round, the nodes
changed since its last read, the nodes not fresh (by their leases), and the names only
when the count says a node was forgotten; and the rounds it plans from that are the
rounds a full read plans, replayed by ``explain --round`` to what they wrote.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, Engine
from sqlalchemy.event import listen, remove

from catalog import Catalog
from events.catalog_service import CatalogService
from events.read.replay import replay
from events.storage.backends import open_log
from scheduler.daemon import round_runner
from scheduler.daemon.round_runner import Placer
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.node_changes import NodeChanges, NodeFeed
from scheduler.persistence.store import PLACED, REMOVED, SchedulerStore
from scheduler.planner.demands import demands
from scheduler.planner.fleet.inventory import NodeReport, parse_node_report
from scheduler.planner.plan import plan
from scheduler.planner.replica_stories import explain
from tests.support import model

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
STALE_AFTER = timedelta(seconds=30)


def _node(name: str, gpus: int = 8, **extra: object) -> NodeReport:
    return parse_node_report({"name": name, "gpu_class": "A100", "gpus": gpus, **extra})


class CountingFeed(NodeFeed):
    """A feed that keeps, per read, whether it was whole and how many nodes it read."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.reads: list[tuple[bool, int]] = []

    def read(self, now: datetime, stale_after: timedelta) -> NodeChanges:
        found = super().read(now, stale_after)
        self.reads.append((found.whole, len(found.nodes) + len(found.not_fresh)))
        return found


class CountingStore(SchedulerStore):
    def node_feed(self) -> CountingFeed:
        self.feed = CountingFeed(self.engine)
        return self.feed


def test_after_the_first_read_only_changed_nodes_and_the_nodes_not_fresh_are_read(
    engine: Engine,
) -> None:
    store = SchedulerStore(engine)
    store.report([_node("a"), _node("b"), _node("c")], T0)
    feed = store.node_feed()
    first = feed.read(T0 + timedelta(seconds=100), STALE_AFTER)
    assert first.whole and {n.name for n in first.nodes} == {"a", "b", "c"}
    assert set(first.not_fresh) == {"a", "b", "c"}  # reported 100 s ago

    # a reports again unchanged, b with a new label; c's agent only beats (its lease).
    at = T0 + timedelta(seconds=180)
    store.report([_node("a"), _node("b", labels={"zone": "eu"})], at)
    store.renew_leases({"c": at})
    later = feed.read(at + timedelta(seconds=5), STALE_AFTER)
    assert not later.whole
    assert [(n.name, dict(n.labels)) for n in later.nodes] == [("b", {"zone": "eu"})]
    assert later.forgotten == frozenset() and later.not_fresh == {}

    # Within the margin after its last read (30 s), b is read again: harmless, the round
    # compares content; past it, not.
    assert [n.name for n in feed.read(at + timedelta(seconds=31), STALE_AFTER).nodes] == ["b"]
    assert feed.read(at + timedelta(seconds=70), STALE_AFTER).nodes == []

    # A node forgotten and one new: the count says so, the names say which.
    store.forget("a")
    store.report([_node("d", 4)], at + timedelta(seconds=75))
    again = feed.read(at + timedelta(seconds=80), STALE_AFTER)
    assert [n.name for n in again.nodes] == ["d"]
    assert again.forgotten == {"a"}
    # b and c fall silent past stale-after: their leases, read by their index.
    quiet = feed.read(at + timedelta(seconds=100), STALE_AFTER)
    assert [n.name for n in quiet.nodes] == ["d"]  # changed within the last read's margin
    assert quiet.forgotten == frozenset()
    assert quiet.not_fresh == {"b": at, "c": at}


def test_a_placer_plans_from_what_changed_as_a_full_round_would_and_records_it(
    engine: Engine,
) -> None:
    declared = Catalog.build(
        [
            model("big", gpu_class="A100", tp=8, scaling={"min": 2}),
            model("small", gpu_class="A100", tp=2, scaling={"min": 3}),
        ]
    )
    events = open_log(engine)
    service = CatalogService(events, declared)
    store = CountingStore(engine)
    policy = StalenessPolicy(stale_after=STALE_AFTER, grace=timedelta(seconds=30))
    placer = Placer(service, store, policy)
    names = [f"n{i}" for i in range(6)]
    store.report([_node(n) for n in names], T0 - timedelta(minutes=1))
    store.renew_leases(dict.fromkeys(names, T0))
    placer.run(now=T0)

    # Ten rounds of heartbeats: every lease renewed, nothing changed. No node row is read
    # (the changed-since query returns none; none is stale), and nothing is recorded.
    for i in range(1, 11):
        at = T0 + timedelta(seconds=10 * i)
        store.renew_leases(dict.fromkeys(names, at))
        outcome = placer.run(now=at)
        assert outcome.round_id is None and outcome.node_count == 6
    assert store.feed.reads == [(True, 6)] + [(False, 0)] * 10, "read nodes not changed"

    # n0 falls silent until it is lost: its replicas are placed again on the others,
    # exactly as a full round on every node (read whole, with its lease) plans it.
    hosted = {n for p in store.state().placements for n in p.nodes}
    silent = sorted(hosted)[0]
    for i in range(11, 19):
        at = T0 + timedelta(seconds=10 * i)
        store.renew_leases({n: at for n in names if n != silent})
        before = store.state()
        outcome = placer.run(now=at)
        full = plan(
            demands(service.catalog(), None),
            store.nodes(),
            before.placements,
            at,
            policy,
            lifecycle=before.lifecycle,
        )
        assert outcome.plan == full, f"round at +{10 * i}s differs from a full round"
    moved = store.state().placements
    assert all(silent not in p.nodes for p in moved)

    # Every recorded round plans again to exactly what it wrote.
    for round_id in range(1, store.state().round_id + 1):
        recorded = store.recorded_round(round_id=round_id)
        assert recorded is not None
        catalog = replay(declared, events.read(until=recorded.catalog_position)).catalog
        written = {
            (e.type, e.model, e.replica, e.nodes)
            for e in store.events()
            if e.round_id == round_id and e.type in (PLACED, REMOVED)
        }
        again: set[tuple[str, str, int, tuple[str, ...]]] = set()
        for name in catalog.names():
            result = explain(
                name,
                catalog=catalog,
                nodes=recorded.nodes,
                current=recorded.current,
                now=recorded.planned_at,
                policy=recorded.policy,
                lifecycle=recorded.lifecycle,
            )
            again |= {(PLACED, p.model, p.replica, p.nodes) for p in result.plan.place} | {
                (REMOVED, r.placement.model, r.placement.replica, r.placement.nodes)
                for r in result.plan.remove
            }
        assert again == written, f"round {round_id} planned again differs"


class RacedFeed(NodeFeed):
    """A feed whose whole read raced a report: the node was committed between the read of
    the rows and the read of the names, so it is among the names but not the rows (what
    PostgreSQL's read-committed statements allow), and taken for unreadable."""

    def _whole(self, conn: Connection, now: datetime, fresh_from: datetime) -> NodeChanges:
        found = super()._whole(conn, now, fresh_from)
        self.raced.report([_node("late")], now)
        assert self._names is not None
        self._names.discard("late")
        self._unreadable.add("late")
        return found

    raced: SchedulerStore


def test_a_node_taken_for_unreadable_by_a_raced_whole_read_is_readable_once_read(
    engine: Engine,
) -> None:
    store = SchedulerStore(engine)
    store.report([_node("a")], T0)
    feed = RacedFeed(engine)
    feed.raced = store
    feed.read(T0 + timedelta(seconds=1), STALE_AFTER)
    name_scans: list[str] = []

    def count(conn: object, cursor: object, statement: str, *rest: object) -> None:
        if (
            statement.lstrip().upper().startswith("SELECT NODES.NAME")
            and "WHERE" not in statement.upper()
        ):
            name_scans.append(statement)

    listen(engine, "before_cursor_execute", count)
    try:
        # The late node is read as changed (within the margin) and known from then on:
        # later rounds do not read every name again for a count that never matches.
        read = feed.read(T0 + timedelta(seconds=2), STALE_AFTER)
        assert "late" in {n.name for n in read.nodes}
        for step in range(3, 6):
            feed.read(T0 + timedelta(seconds=step), STALE_AFTER)
    finally:
        remove(engine, "before_cursor_execute", count)
    assert name_scans == []


def test_a_placer_round_with_nothing_changed_makes_no_demands_and_judges_no_placement_again(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 100,000 nodes making the demands from the catalog and comparing every placement
    with the round before's (to find a plan that writes nothing) cost most of a round with
    nothing changed: done again only when the catalog, the autoscaler's counts, the plan
    or the placements are others; the rounds are the same."""
    declared = Catalog.build([model("big", gpu_class="A100", tp=8, scaling={"min": 1, "max": 4})])
    service = CatalogService(open_log(engine), declared)
    made: list[int] = []
    counted = demands

    def counting(*args: object, **kwargs: object) -> object:
        made.append(1)
        return counted(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(round_runner, "demands", counting)
    applied: list[int | None] = []
    store = CountingStore(engine)
    apply = store.apply

    def counting_apply(*args: object, **kwargs: object) -> int | None:
        applied.append(result := apply(*args, **kwargs))  # type: ignore[arg-type]
        return result

    monkeypatch.setattr(store, "apply", counting_apply)
    wanted = {"big": 1}
    policy = StalenessPolicy(stale_after=STALE_AFTER, grace=timedelta(seconds=30))
    placer = Placer(service, store, policy, wanted=lambda: wanted)
    names = [f"n{i}" for i in range(4)]
    store.report([_node(n) for n in names], T0 - timedelta(minutes=1))
    store.renew_leases(dict.fromkeys(names, T0))
    assert placer.run(now=T0).round_id is not None
    assert (len(made), len(applied)) == (1, 1)

    for i in range(1, 4):
        at = T0 + timedelta(seconds=10 * i)
        store.renew_leases(dict.fromkeys(names, at))
        outcome = placer.run(now=at)
        assert outcome.round_id is None and outcome.plan.place == ()
    assert (len(made), len(applied)) == (1, 1), "demands made or placements judged again"

    # The autoscaler asks for more (the same mapping, changed): the demands are made again
    # and the round places them, as a full round does.
    wanted["big"] = 3
    at = T0 + timedelta(seconds=40)
    store.renew_leases(dict.fromkeys(names, at))
    before = store.state()
    outcome = placer.run(now=at)
    assert len(made) == 2 and outcome.round_id is not None and len(outcome.plan.place) == 2
    full = plan(
        counted(service.catalog(), wanted),
        store.nodes(),
        before.placements,
        at,
        policy,
        lifecycle=before.lifecycle,
    )
    assert outcome.plan == full
    assert len(store.state().placements) == 3
