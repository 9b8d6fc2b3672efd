"""A remembered plan is the plan: equal round keys, equal plans, whatever the clock says."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.lifecycle.inputs import Cordon, FailureRecord, Lifecycle
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement
from scheduler.planner.plan import plan
from scheduler.planner.plan_cache import (
    NODE_FIELDS,
    PLACEMENT_FIELDS,
    STATUS_FIELDS,
    PlanMemo,
    round_key,
)
from tests.unit.scheduler.placement_builders import NOW, cpu_profile, node, profile
from tests.unit.scheduler.reference_rounds import digest

POLICY = StalenessPolicy(stale_after=timedelta(seconds=90), grace=timedelta(seconds=300))
STATES = ["ready", "ready", "starting", "placed", "failed"]


def test_the_key_holds_every_field_the_planner_reads() -> None:
    """A field added to a node, a placement or a replica state must be added to the key."""
    node_fields = {f.name for f in dataclasses.fields(Node)}
    assert set(NODE_FIELDS) == node_fields - {"reported_at"}
    assert set(PLACEMENT_FIELDS) == {f.name for f in dataclasses.fields(Placement)}
    assert set(STATUS_FIELDS) == {f.name for f in dataclasses.fields(ReplicaStatus)}


@st.composite
def rounds(draw: st.DrawFn) -> tuple[list[Demand], list[Node], list[Placement], Lifecycle | None]:
    count = draw(st.integers(min_value=1, max_value=8))
    nodes = [
        node(
            f"n{i}",
            draw(st.sampled_from(["A100", "L4", None])),
            draw(st.sampled_from([1, 2, 8])),
            memory_gb=draw(st.sampled_from([None, 64.0, 512.0])),
            labels=draw(st.sampled_from([{}, {"zone": "eu"}, {"zone": "us"}])),
            fabric=draw(st.sampled_from([None, "ib"])),
            silent_for=timedelta(seconds=draw(st.sampled_from([0, 60, 85, 100, 380, 400, 2000]))),
        )
        for i in range(count)
    ]
    demands = [
        Demand(
            f"m{i}",
            draw(st.integers(min_value=0, max_value=4)),
            (
                profile("big", "A100", draw(st.sampled_from([1, 8])), priority=5),
                profile("small", "L4", 1, selector=draw(st.sampled_from([{}, {"zone": "eu"}]))),
                cpu_profile(memory_gb=draw(st.sampled_from([0, 32]))),
            ),
            priority=draw(st.sampled_from([0, 1])),
            spread_by=draw(st.sampled_from([None, "zone"])),
        )
        for i in range(draw(st.integers(min_value=1, max_value=3)))
    ]
    # What an earlier round (everything fresh then) placed is what runs now.
    before = [dataclasses.replace(n, reported_at=NOW) for n in nodes]
    current = list(plan(demands, before, (), NOW).placements)
    lifecycle = None
    if draw(st.booleans()):
        placed_at = NOW - timedelta(minutes=draw(st.sampled_from([1, 19, 21, 60])))
        statuses = {
            (p.model, p.replica): ReplicaStatus(
                draw(st.sampled_from(STATES)), placed_at, placed_at, reported=draw(st.booleans())
            )
            for p in current
            if draw(st.booleans())
        }
        failures = tuple(
            FailureRecord(
                "m0",
                n.name,
                draw(st.integers(min_value=1, max_value=3)),
                NOW - timedelta(seconds=draw(st.sampled_from([10, 50, 70, 200, 5000]))),
                "crashed",
            )
            for n in nodes
            if draw(st.booleans())
        )
        cordons = {
            n.name: Cordon(n.name, draw(st.sampled_from(["cordoned", "draining"])), "ops", "", NOW)
            for n in nodes
            if draw(st.integers(min_value=0, max_value=4)) == 0
        }
        lifecycle = Lifecycle(statuses=statuses, cordons=cordons, failures=failures)
    return demands, nodes, current, lifecycle


@settings(max_examples=300, deadline=None)
@given(rounds(), st.sampled_from([0, 1, 5, 20, 29, 31, 60, 200, 310, 3600]))
def test_equal_keys_mean_equal_plans(
    inputs: tuple[list[Demand], list[Node], list[Placement], Lifecycle | None], later: int
) -> None:
    demands, nodes, current, lifecycle = inputs
    then, now = NOW, NOW + timedelta(seconds=later)
    key_then = round_key(demands, nodes, current, then, POLICY, lifecycle=lifecycle)
    key_now = round_key(demands, nodes, current, now, POLICY, lifecycle=lifecycle)
    if key_then is None or key_then != key_now:
        return
    first = plan(demands, nodes, current, then, POLICY, lifecycle=lifecycle)
    second = plan(demands, nodes, current, now, POLICY, lifecycle=lifecycle)
    assert digest(first) == digest(second)


@settings(max_examples=150, deadline=None)
@given(rounds(), st.lists(st.sampled_from([0, 1, 30, 95, 400]), min_size=1, max_size=4))
def test_the_memo_answers_what_plan_answers(
    inputs: tuple[list[Demand], list[Node], list[Placement], Lifecycle | None], steps: list[int]
) -> None:
    demands, nodes, current, lifecycle = inputs
    memo = PlanMemo()
    for seconds in steps:
        now = NOW + timedelta(seconds=seconds)
        remembered = memo(demands, nodes, current, now, POLICY, lifecycle=lifecycle)
        assert digest(remembered) == digest(
            plan(demands, nodes, current, now, POLICY, lifecycle=lifecycle)
        )


def test_an_unchanged_round_is_remembered_and_a_changed_one_is_not() -> None:
    nodes = [node("a"), node("b", silent_for=timedelta(seconds=100))]
    demands = [Demand("m", 2, (profile(gpus=4),))]
    memo = PlanMemo()
    first = memo(demands, nodes, (), NOW)
    current = first.placements
    again = memo(demands, nodes, current, NOW)
    # Reports arrive (new times, same freshness): the same plan, not planned again.
    reported = [
        dataclasses.replace(n, reported_at=n.reported_at + timedelta(seconds=5)) for n in nodes
    ]
    assert memo(demands, reported, current, NOW + timedelta(seconds=5)) is again
    assert (memo.hits, memo.misses) == (1, 2)
    # Node b turns fresh: a different input, planned again.
    revived = [node("a"), node("b")]
    assert digest(memo(demands, revived, current, NOW)) == digest(
        plan(demands, revived, current, NOW)
    )
    assert memo.misses == 3
