"""A round reads the placements that changed, not every placement, on both back ends
(issue 42).

Every write to placements (a round's, a replica report's) stamps its rows with the next
number of a change sequence taken under the numbering lock; a placer's feed reads, after
its first round, the rows stamped since the number it last saw, the keys only when the
count says a placement was deleted, and the nodes reporting replica states only when
their set changed. What it answers is what a whole read answers, over random writes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from catalog import Catalog
from events.catalog_service import CatalogService
from events.read.replay import replay
from events.storage.backends import open_log
from scheduler.daemon.round_runner import Placer
from scheduler.lifecycle.staleness import DEFAULT_STALENESS, StalenessPolicy
from scheduler.persistence.node_changes import WHOLE_EVERY
from scheduler.persistence.placement_changes import PlacementFeed, PlacementRead
from scheduler.persistence.round_store import PlacementState
from scheduler.persistence.store import PLACED, REMOVED, SchedulerStore
from scheduler.planner.demands import demands
from scheduler.planner.fleet.inventory import parse_node_report
from scheduler.planner.fleet.placements import Placement, Plan, Removal
from scheduler.planner.plan import plan
from scheduler.planner.replica_stories import explain
from tests.support import model

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MODELS = ("m0", "m1")
NODES = ("n0", "n1", "n2")


def _placement(model: str, replica: int, nodes: tuple[str, ...], memory: int = 10) -> Placement:
    return Placement(model, replica, "p", nodes, 2, "A100", memory)


def _apply(store: SchedulerStore, now: datetime, **plan: Any) -> None:
    fields: dict[str, Any] = {"keep": (), "place": (), "remove": (), "unplaced": ()}
    store.apply(
        Plan(**(fields | plan)),
        based_on=store.state(),
        catalog_position=0,
        nodes=[],
        now=now,
        policy=DEFAULT_STALENESS,
    )


def _report(store: SchedulerStore, node: str, now: datetime, replicas: Any = None) -> None:
    body: dict[str, Any] = {"name": node, "gpu_class": "A100", "gpus": 8}
    if replicas is not None:
        body["replicas"] = replicas
    store.report([parse_node_report(body)], now)


def _view(state: PlacementState) -> tuple[Any, ...]:
    """What a round plans from (the order of the placements aside)."""
    life = state.lifecycle
    return (
        state.round_id,
        sorted(state.placements, key=lambda p: (p.model, p.replica)),
        life.statuses,
        life.cordons,
        life.failures,
        life.running,
    )


# One write to the store: (kind, model, replica, node, a small number).
WRITES = st.lists(
    st.tuples(
        st.sampled_from(["place", "remove", "update", "report", "quiet", "forget", "cordon"]),
        st.sampled_from(MODELS),
        st.integers(0, 2),
        st.sampled_from(NODES),
        st.integers(0, 3),
    ),
    max_size=14,
)


def _write(store: SchedulerStore, now: datetime, write: tuple[str, str, int, str, int]) -> None:
    kind, model, replica, node, n = write
    placed = {(p.model, p.replica): p for p in store.state().placements}
    current = placed.get((model, replica))
    if kind == "place" and current is None:
        nodes = (node,) if n < 2 else tuple(sorted({node, NODES[n % len(NODES)]}))
        _apply(store, now, place=(_placement(model, replica, nodes),))
    elif kind == "remove" and current is not None:
        _apply(store, now, remove=(Removal(current, "gone"),))
    elif kind == "update" and current is not None:
        _apply(store, now, keep=(_placement(model, replica, current.nodes, 10 + n + 1),))
    elif kind == "report":
        state = ("starting", "ready", "failed", "ready")[n]
        entry = {"model": model, "replica": replica, "state": state, "message": f"said {n}"}
        _report(store, node, now, [entry])
    elif kind == "quiet":
        _report(store, node, now, [] if n % 2 else None)
    elif kind == "forget":
        store.forget(node)
    elif kind == "cordon":
        store.cordon(node, ("cordoned", "draining", None, None)[n], actor="op", reason="r")


@pytest.mark.slow  # (tests/xdist_groups.py: handed out first)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rounds=st.lists(st.tuples(WRITES, st.integers(0, 200)), min_size=1, max_size=6))
def test_the_feed_answers_what_a_whole_read_answers_after_any_writes(
    engine: Engine, rounds: list[tuple[list[tuple[str, str, int, str, int]], int]]
) -> None:
    store = SchedulerStore(engine)
    feed = PlacementFeed(engine)
    now = T0
    first = feed.read(now)
    assert first.whole and _view(first.state) == _view(store.state())
    for writes, seconds in rounds:
        for write in writes:
            _write(store, now, write)
        now += timedelta(seconds=seconds)
        before = feed.read(now)
        assert _view(before.state) == _view(store.state())
        # Read again with nothing written: the same objects, nothing said changed.
        again = feed.read(now)
        assert not again.changed
        assert again.state.placements is before.state.placements
        assert again.state.lifecycle is before.state.lifecycle


def test_after_the_first_read_only_rows_written_since_are_read(engine: Engine) -> None:
    store = SchedulerStore(engine)
    _report(store, "n0", T0, [])
    _apply(store, T0, place=(_placement("m0", 0, ("n0",)), _placement("m0", 1, ("n0",))))
    feed = PlacementFeed(engine)
    assert feed.read(T0).whole

    # A row changed by hand, outside any write that stamps it: the feed does not read it
    # (it reads only what was written since), until its whole read comes round.
    with engine.begin() as conn:
        conn.execute(text("UPDATE placements SET message = 'by hand' WHERE replica = 1"))
    _report(store, "n0", T0, [{"model": "m0", "replica": 0, "state": "ready"}])
    later = feed.read(T0 + timedelta(seconds=10))
    assert not later.whole and later.changed
    statuses = later.state.lifecycle.statuses
    assert statuses[("m0", 0)].state == "ready"
    assert statuses[("m0", 1)].message == ""
    assert store.state().lifecycle.statuses[("m0", 1)].message == "by hand"

    whole = feed.read(T0 + WHOLE_EVERY + timedelta(seconds=10))
    assert whole.whole and whole.state.lifecycle.statuses[("m0", 1)].message == "by hand"
    assert _view(whole.state) == _view(store.state())


def test_a_node_that_begins_reporting_replicas_changes_their_state_without_a_row_write(
    engine: Engine,
) -> None:
    store = SchedulerStore(engine)
    _report(store, "n0", T0)
    _report(store, "n1", T0)
    _apply(store, T0, place=(_placement("m0", 0, ("n0",)), _placement("m1", 0, ("n1",))))
    feed = PlacementFeed(engine)
    assert not feed.read(T0).state.lifecycle.statuses[("m1", 0)].reported
    # n1's agent now reports replicas (none of them): m1[0]'s row is not written, but it is
    # now reported (and may time out); the feed reads the reporting nodes again.
    _report(store, "n1", T0, [])
    later = feed.read(T0 + timedelta(seconds=5))
    assert not later.whole and later.state.lifecycle.statuses[("m1", 0)].reported
    # n1 forgotten: not reporting any more.
    store.forget("n1")
    gone = feed.read(T0 + timedelta(seconds=6))
    assert not gone.state.lifecycle.statuses[("m1", 0)].reported
    assert _view(gone.state) == _view(store.state())


class CountingFeed(PlacementFeed):
    """A feed that keeps, per read, whether it was whole and whether anything changed."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.reads: list[tuple[bool, bool]] = []

    def read(self, now: datetime) -> PlacementRead:
        found = super().read(now)
        self.reads.append((found.whole, found.changed))
        return found


class CountingStore(SchedulerStore):
    def placement_feed(self) -> CountingFeed:
        self.feed = CountingFeed(self.engine)
        return self.feed


def test_a_placer_plans_from_the_placements_written_as_a_full_round_would_and_records_it(
    engine: Engine,
) -> None:
    declared = Catalog.build([model("small", gpu_class="A100", tp=2, scaling={"min": 3})])
    events = open_log(engine)
    service = CatalogService(events, declared)
    store = CountingStore(engine)
    policy = StalenessPolicy(stale_after=timedelta(seconds=30), grace=timedelta(seconds=30))
    placer = Placer(service, store, policy)
    names = [f"n{i}" for i in range(4)]
    for name in names:
        _report(store, name, T0, [])
    placer.run(now=T0)

    # The next round reads what the first wrote; then, nothing written, no placement is
    # read and the plan is the round before's.
    for i in range(1, 5):
        at = T0 + timedelta(seconds=5 * i)
        store.renew_leases(dict.fromkeys(names, at))
        assert placer.run(now=at).round_id is None
    assert store.feed.reads == [(True, True), (False, True)] + [(False, False)] * 3

    # A replica's agent says it failed: the next round reads that row, replaces it, and
    # plans what a full round on the placements read whole plans.
    failed = store.state().placements[0]
    at = T0 + timedelta(seconds=25)
    store.renew_leases(dict.fromkeys(names, at))
    said = {"model": failed.model, "replica": failed.replica, "state": "failed"}
    _report(store, failed.nodes[0], at, [said])
    before = store.state()
    outcome = placer.run(now=at)
    assert store.feed.reads[-1] == (False, True)
    full = plan(
        demands(service.catalog(), None),
        store.nodes(),
        before.placements,
        at,
        policy,
        lifecycle=before.lifecycle,
    )
    assert outcome.plan == full and [r.placement for r in full.remove] == [failed]

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
        result = explain(
            "small",
            catalog=catalog,
            nodes=recorded.nodes,
            current=recorded.current,
            now=recorded.planned_at,
            policy=recorded.policy,
            lifecycle=recorded.lifecycle,
        )
        again = {(PLACED, p.model, p.replica, p.nodes) for p in result.plan.place} | {
            (REMOVED, r.placement.model, r.placement.replica, r.placement.nodes)
            for r in result.plan.remove
        }
        assert again == written, f"round {round_id} planned again differs"


def test_a_row_written_unreadable_is_dropped_as_a_whole_read_skips_it(engine: Engine) -> None:
    store = SchedulerStore(engine)
    _report(store, "n0", T0, [])
    _apply(store, T0, place=(_placement("m0", 0, ("n0",)), _placement("m0", 1, ("n0",))))
    feed = PlacementFeed(engine)
    feed.read(T0)
    # Written (stamped with the next change) but unreadable: its nodes are not JSON.
    with engine.begin() as conn:
        conn.execute(text("UPDATE placement_changes SET seq = seq + 1"))
        conn.execute(
            text(
                "UPDATE placements SET nodes = 'not json', "
                "change_seq = (SELECT seq FROM placement_changes) WHERE replica = 1"
            )
        )
    later = feed.read(T0 + timedelta(seconds=5))
    assert not later.whole and [p.replica for p in later.state.placements] == [0]
    assert _view(later.state) == _view(store.state())
    # Read again, nothing written: the unreadable row is not taken for a deletion.
    assert not feed.read(T0 + timedelta(seconds=10)).changed
