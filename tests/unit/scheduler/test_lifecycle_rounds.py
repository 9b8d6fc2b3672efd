"""The replica lifecycle in the pure planner: timeouts, failures and back-off, cordons, rollouts.

Rounds are simulated: each round's placements are the next round's current
ones, and an "agent" reports replicas ready when the test says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.lifecycle.inputs import (
    BackoffPolicy,
    Cordon,
    FailureRecord,
    Lifecycle,
    ModelLifecycle,
)
from scheduler.lifecycle.replica_reports import FAILED, PLACED, READY, ReplicaStatus
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement, Plan
from scheduler.planner.plan import plan
from tests.unit.scheduler.placement_builders import NOW, node, overcommitted, profile

A100x2 = profile("a100x2", gpus=2)


def spec(fingerprint: str = "v1", *, surge: int = 1, unavailable: int = 0) -> ModelLifecycle:
    return ModelLifecycle(
        fingerprints={"a100x2": fingerprint},
        startup_timeouts={"a100x2": timedelta(minutes=20)},
        max_surge=surge,
        max_unavailable=unavailable,
    )


def llama(replicas: int, fingerprint: str = "v1", **kwargs: int) -> Demand:
    return Demand("llama", replicas, (A100x2,), spec(fingerprint, **kwargs))


def status(state: str, placed_at: datetime = NOW, message: str = "") -> ReplicaStatus:
    return ReplicaStatus(state, placed_at, placed_at, message=message)


class Cluster:
    """Rounds over a fixed inventory, with replica states reported between them."""

    def __init__(self, nodes: Sequence[Node], demands: Sequence[Demand]) -> None:
        self.nodes = list(nodes)
        self.demands = list(demands)
        self.current: tuple[Placement, ...] = ()
        self.statuses: dict[tuple[str, int], ReplicaStatus] = {}
        self.cordons: dict[str, Cordon] = {}
        self.failures: list[FailureRecord] = []
        self.now = NOW

    def round(self) -> Plan:
        # Every agent heartbeats: the nodes are fresh whatever the time.
        self.nodes = [replace(n, reported_at=self.now) for n in self.nodes]
        result = plan(
            self.demands,
            self.nodes,
            self.current,
            self.now,
            lifecycle=Lifecycle(
                statuses=dict(self.statuses),
                cordons=dict(self.cordons),
                failures=tuple(self.failures),
            ),
        )
        for r in result.remove:
            self.statuses.pop((r.placement.model, r.placement.replica), None)
        for p in result.place:
            self.statuses[(p.model, p.replica)] = status(PLACED, self.now)
        for f in result.failures:
            for n in f.placement.nodes:
                self.failures = [
                    x for x in self.failures if (x.model, x.node) != (f.placement.model, n)
                ] + [FailureRecord(f.placement.model, n, 1, self.now, f.reason)]
        self.current = result.placements
        assert not overcommitted(result.placements, self.nodes)
        return result

    def report_all(self, state: str = READY) -> None:
        for key, s in self.statuses.items():
            if s.state == PLACED:
                self.statuses[key] = replace(s, state=state, since=self.now)

    def ready(self, model: str = "llama") -> int:
        return sum(
            1
            for p in self.current
            if p.model == model and self.statuses[(p.model, p.replica)].state == READY
        )


def test_a_replica_not_ready_within_its_startup_timeout_fails_and_is_placed_on_another_node() -> (
    None
):
    cluster = Cluster([node("n1", gpus=2), node("n2", gpus=2)], [llama(1)])
    (first,) = cluster.round().place
    cluster.now = NOW + timedelta(minutes=21)

    result = cluster.round()

    (failure,) = result.failures
    assert failure.reason == "startup timeout"
    (removal,) = result.remove
    assert removal.reason.startswith("startup timeout: not ready 20m after it was placed on n1")
    (again,) = result.place
    assert again.replica == first.replica and again.nodes != first.nodes
    assert result.notes == (
        (
            "llama",
            "avoiding node n1 until 2026-03-01T12:22:00+00:00 (1 failure there, last: "
            "startup timeout)",
        ),
    )


def test_a_replica_within_its_timeout_or_on_an_agent_that_reports_no_states_is_kept() -> None:
    cluster = Cluster([node("n1", gpus=2)], [llama(1)])
    cluster.round()
    cluster.now = NOW + timedelta(minutes=19)
    assert not cluster.round().changes_anything
    cluster.now = NOW + timedelta(hours=5)
    key = ("llama", 0)
    cluster.statuses[key] = replace(cluster.statuses[key], reported=False)
    assert not cluster.round().changes_anything


def test_a_reported_failure_moves_the_replica_and_with_every_node_backing_off_says_so() -> None:
    cluster = Cluster([node("n1", gpus=2), node("n2", gpus=2)], [llama(1)])
    cluster.round()
    cluster.statuses[("llama", 0)] = status(FAILED, message="CUDA out of memory")
    moved = cluster.round()
    assert moved.failures[0].reason == "CUDA out of memory"
    assert moved.place[0].nodes == ("n2",)

    cluster.statuses[("llama", 0)] = status(FAILED, message="CUDA out of memory")
    stuck = cluster.round()
    (unplaced,) = stuck.unplaced
    assert unplaced.reason == (
        "profile a100x2: 0/2 nodes fit: 2 are backing off after this model failed there"
    )


def test_the_back_off_doubles_with_each_failure_up_to_its_cap() -> None:
    policy = BackoffPolicy(base=timedelta(minutes=1), cap=timedelta(minutes=5))
    assert [policy.wait(n) for n in (1, 2, 3, 4, 40)] == [
        timedelta(minutes=m) for m in (1, 2, 4, 5, 5)
    ]


def test_a_cordoned_node_takes_nothing_new_keeps_what_runs_and_is_its_own_reason() -> None:
    cluster = Cluster([node("n1", gpus=2), node("n2", gpus=2)], [llama(1)])
    cluster.round()
    cluster.cordons = {"n1": Cordon("n1", "cordoned", "alice", "bad fan", NOW)}
    assert not cluster.round().changes_anything
    cluster.demands = [llama(3)]

    result = cluster.round()

    assert [p.nodes for p in result.place] == [("n2",)]
    (unplaced,) = result.unplaced
    assert unplaced.reason == (
        "profile a100x2: 0/2 nodes fit: 1 is cordoned or draining, 1 has fewer than 2 free GPUs"
    )


def test_a_changed_definition_is_rolled_out_surge_first_one_at_a_time() -> None:
    cluster = Cluster([node("n1", gpus=4), node("n2", gpus=4)], [llama(3, "v1")])
    cluster.round()
    cluster.report_all()
    cluster.demands = [llama(3, "v2")]

    first = cluster.round()
    assert [p.fingerprint for p in first.place] == ["v2"]
    assert not first.remove
    (progress,) = first.rollouts
    assert len(progress.old) == 3
    assert progress.waiting == f"waiting for replica(s) {first.place[0].replica} to report ready"
    # Not ready yet: nothing more happens.
    assert not cluster.round().changes_anything

    rounds = 0
    while any(p.fingerprint == "v1" for p in cluster.current):
        cluster.report_all()
        cluster.round()
        assert cluster.ready() >= 3
        rounds += 1
    assert rounds == 3
    cluster.report_all()
    assert {p.fingerprint for p in cluster.current} == {"v2"} and cluster.ready() == 3


def test_without_room_to_surge_a_rollout_waits_and_says_why() -> None:
    cluster = Cluster([node("n1", gpus=2), node("n2", gpus=2)], [llama(2, "v1")])
    cluster.round()
    cluster.report_all()
    cluster.demands = [llama(2, "v2")]

    result = cluster.round()

    assert not result.changes_anything and not result.unplaced
    (progress,) = result.rollouts
    assert progress.waiting == (
        "waiting for room for a surge replica: profile a100x2: 0/2 nodes fit: 2 have fewer "
        "than 2 free GPUs; max_unavailable is 0, so no old replica is stopped first"
    )


def test_with_max_unavailable_one_a_full_cluster_replaces_in_place_one_at_a_time() -> None:
    cluster = Cluster([node("n1", gpus=2), node("n2", gpus=2)], [llama(2, "v1")])
    cluster.round()
    cluster.report_all()
    cluster.demands = [llama(2, "v2", surge=0, unavailable=1)]

    first = cluster.round()
    assert len(first.remove) == 1 and len(first.place) == 1
    assert first.remove[0].placement.nodes == first.place[0].nodes  # in place
    assert cluster.ready() == 1
    assert not cluster.round().changes_anything  # waits for the new one
    cluster.report_all()
    cluster.round()
    cluster.report_all()
    assert {p.fingerprint for p in cluster.current} == {"v2"} and cluster.ready() == 2


def test_draining_a_node_moves_its_replicas_surge_first_and_leaves_it_empty() -> None:
    nodes = [node("n1", gpus=6), node("n2", gpus=6)]
    cluster = Cluster(nodes, [llama(3)])
    cluster.round()
    cluster.report_all()
    # Spread (placement policy) puts the replicas on both nodes, two on n1.
    assert sorted(p.nodes for p in cluster.current) == [("n1",), ("n1",), ("n2",)]
    cluster.cordons = {"n1": Cordon("n1", "draining", "bob", "kernel update", NOW)}
    while any("n1" in p.nodes for p in cluster.current):
        result = cluster.round()
        assert cluster.ready() >= 3
        assert all("n1" not in p.nodes for p in result.place)
        cluster.report_all()
    assert cluster.ready() == 3


def test_a_placement_recorded_before_fingerprints_gets_one_and_is_not_rolled() -> None:
    old = Placement("llama", 0, "a100x2", ("n1",), 2, "A100")
    result = plan([llama(1)], [node("n1", gpus=2)], [old], NOW, lifecycle=Lifecycle())
    assert result.keep == (replace(old, fingerprint="v1"),) and not result.changes_anything


@settings(max_examples=60, deadline=None)
@given(
    wanted=st.integers(1, 4),
    surge=st.integers(0, 2),
    unavailable=st.integers(0, 2),
    spare=st.integers(0, 3),
)
def test_a_rollout_never_drops_below_min_minus_max_unavailable_and_always_finishes(
    wanted: int, surge: int, unavailable: int, spare: int
) -> None:
    if surge == 0 and unavailable == 0:
        return  # refused by the catalog
    nodes = [node(f"n{i}", gpus=2) for i in range(wanted + spare)]
    cluster = Cluster(nodes, [llama(wanted, "v1", surge=surge, unavailable=unavailable)])
    cluster.round()
    cluster.report_all()
    cluster.demands = [llama(wanted, "v2", surge=surge, unavailable=unavailable)]
    stuck = spare == 0 and unavailable == 0
    for _ in range(4 * wanted + 4):
        result = cluster.round()
        assert cluster.ready() >= wanted - unavailable
        assert len(cluster.current) <= wanted + surge
        cluster.report_all()
        if stuck:
            assert result.rollouts and "room for a surge replica" in result.rollouts[0].waiting
    done = all(p.fingerprint == "v2" for p in cluster.current)
    assert done != stuck
    if done:
        assert cluster.ready() == wanted


def test_lifecycle_inputs_survive_their_record_and_plan_the_same() -> None:
    lifecycle = Lifecycle(
        statuses={("llama", 0): status(FAILED, message="oom")},
        cordons={"n2": Cordon("n2", "draining", "bob", "why", NOW)},
        failures=(FailureRecord("llama", "n3", 2, NOW, "startup timeout"),),
    )
    again = Lifecycle.from_json(lifecycle.to_json())
    assert again == lifecycle
    nodes = [node(f"n{i}", gpus=2) for i in range(1, 5)]
    current = [Placement("llama", 0, "a100x2", ("n1",), 2, "A100", fingerprint="v1")]
    assert plan([llama(2)], nodes, current, NOW, lifecycle=lifecycle) == plan(
        [llama(2)], nodes, current, NOW, lifecycle=again
    )
