"""A round planned from what changed is the round planned in full, on any fleet and changes.

``IncrementalRounds`` is told only what a store can read cheaply (the nodes reported with
new content, those forgotten, the nodes not fresh now with their lease times, and the
demands, placements and lifecycle when they were read anew); a full round is given every
node with its real lease time. Their plans must be equal, round after round, whatever
changed; and the nodes the incremental round records must plan again to the same plan
(``explain --round``).
"""

from __future__ import annotations

import dataclasses
import functools
from datetime import datetime, timedelta

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from scheduler.lifecycle.inputs import Cordon, FailureRecord, Lifecycle
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement
from scheduler.planner.plan import plan
from scheduler.planner.rounds.incremental import (
    NODE_FIELDS,
    PLACEMENT_FIELDS,
    STATUS_FIELDS,
    Changes,
    IncrementalRounds,
)
from tests.unit.scheduler.placement_builders import NOW, cpu_profile, node, profile
from tests.unit.scheduler.reference_rounds import digest

POLICY = StalenessPolicy(stale_after=timedelta(seconds=90), grace=timedelta(seconds=300))
STATES = ["ready", "ready", "ready", "starting", "placed", "failed"]


def test_a_change_is_judged_by_every_field_the_planner_reads() -> None:
    """A field added to a node, a placement or a replica state must be compared too, or a
    round that changed only that field would be taken for one with nothing changed."""
    node_fields = {f.name for f in dataclasses.fields(Node)}
    assert set(NODE_FIELDS) == node_fields - {"reported_at"}
    assert set(PLACEMENT_FIELDS) == {f.name for f in dataclasses.fields(Placement)}
    assert set(STATUS_FIELDS) == {f.name for f in dataclasses.fields(ReplicaStatus)}


# The strategies drawn from below, made once (as in test_round_chain.py): built inline,
# each draw made new strategy objects for Hypothesis to validate and label again.
_CLASS = st.sampled_from(["A100", "L4", None])
_GPUS = st.sampled_from([1, 2, 8])
_MEMORY = st.sampled_from([None, 64.0, 512.0])
_LABELS = st.sampled_from([{}, {"zone": "eu"}, {"zone": "us"}])
_FABRIC = st.sampled_from([None, "ib"])
_BIG_GPUS = st.sampled_from([1, 8])
_SELECTOR = st.sampled_from([{}, {"zone": "eu"}])
_CPU_MEMORY = st.sampled_from([0, 32])
_PRIORITY = st.sampled_from([0, 1])
_SPREAD = st.sampled_from([None, "zone"])
_PLACED_MINUTES = st.sampled_from([1, 19, 21, 60])
_STATE = st.sampled_from(STATES)
_BOOL = st.booleans()
_FAILED_SECONDS = st.sampled_from([10, 50, 70, 200])
_CORDON = st.sampled_from(["cordoned", "draining"])
_0_TO_3 = st.integers(min_value=0, max_value=3)
_0_TO_4 = st.integers(min_value=0, max_value=4)
_0_TO_5 = st.integers(min_value=0, max_value=5)
_1_TO_3 = st.integers(min_value=1, max_value=3)


# The tests ask for these again and again: made once (for each name).
@functools.cache
@st.composite
def a_node(draw: st.DrawFn, name: str) -> Node:
    return node(
        name,
        draw(_CLASS),
        draw(_GPUS),
        memory_gb=draw(_MEMORY),
        labels=draw(_LABELS),
        fabric=draw(_FABRIC),
    )


@functools.cache
@st.composite
def some_demands(draw: st.DrawFn) -> list[Demand]:
    return [
        Demand(
            f"m{i}",
            draw(_0_TO_4),
            (
                profile("big", "A100", draw(_BIG_GPUS), priority=5),
                profile("small", "L4", 1, selector=draw(_SELECTOR)),
                cpu_profile(memory_gb=draw(_CPU_MEMORY)),
            ),
            priority=draw(_PRIORITY),
            spread_by=draw(_SPREAD),
        )
        for i in range(draw(_1_TO_3))
    ]


@st.composite
def a_lifecycle(
    draw: st.DrawFn, current: tuple[Placement, ...], names: list[str], now: datetime
) -> Lifecycle:
    placed_at = now - timedelta(minutes=draw(_PLACED_MINUTES))
    statuses = {
        (p.model, p.replica): ReplicaStatus(
            draw(_STATE), placed_at, placed_at, reported=draw(_BOOL)
        )
        for p in current
        if draw(_BOOL)
    }
    failures = tuple(
        FailureRecord(
            "m0",
            name,
            draw(_1_TO_3),
            now - timedelta(seconds=draw(_FAILED_SECONDS)),
            "crashed",
        )
        for name in names
        if draw(_0_TO_3) == 0
    )
    cordons = {
        name: Cordon(name, draw(_CORDON), "ops", "", now) for name in names if draw(_0_TO_5) == 0
    }
    return Lifecycle(statuses=statuses, cordons=cordons, failures=failures)


def _full(
    demands: list[Demand],
    nodes: dict[str, Node],
    current: tuple[Placement, ...],
    now: datetime,
    lifecycle: Lifecycle,
) -> str:
    return digest(plan(demands, list(nodes.values()), current, now, POLICY, lifecycle=lifecycle))


@pytest.mark.slow  # (tests/xdist_groups.py: handed out first)
@settings(max_examples=200, deadline=None, report_multiple_bugs=False)
@given(st.data())
def test_a_round_from_its_changes_is_the_full_round(data: st.DataObject) -> None:
    draw = data.draw
    count = draw(st.integers(min_value=1, max_value=8))
    fleet = {f"n{i}": draw(a_node(f"n{i}")) for i in range(count)}
    demands = draw(some_demands())
    current: tuple[Placement, ...] = ()
    lifecycle = Lifecycle()
    now = NOW
    rounds = IncrementalRounds()
    first = rounds.start(demands, list(fleet.values()), current, now, POLICY, lifecycle=lifecycle)
    assert digest(first) == _full(demands, fleet, current, now, lifecycle)
    written = first
    added = count
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        now += timedelta(seconds=draw(st.sampled_from([0, 1, 10, 60, 95, 200, 400, 3600])))
        reported: list[Node] = []
        forgotten: list[str] = []
        # Leases: most nodes beat (their lease moves on, their content does not), some
        # fall silent; neither is told to the incremental round but through not_fresh.
        for name, n in list(fleet.items()):
            if draw(st.integers(min_value=0, max_value=7)) > 0:
                fleet[name] = dataclasses.replace(n, reported_at=now)
        # A quiet round (nothing reported but leases) or one with changes: a few nodes
        # report new content (or the same again), one may be forgotten or added.
        new_current = new_demands = None
        new_lifecycle = None
        if not draw(st.booleans()):
            for name in draw(st.lists(st.sampled_from(sorted(fleet)), max_size=2, unique=True)):
                changed = draw(a_node(name)) if draw(st.booleans()) else fleet[name]
                fleet[name] = dataclasses.replace(changed, reported_at=now)
                reported.append(fleet[name])
            if len(fleet) > 1 and draw(st.integers(min_value=0, max_value=4)) == 0:
                gone = draw(st.sampled_from(sorted(fleet)))
                del fleet[gone]
                forgotten.append(gone)
                reported = [n for n in reported if n.name != gone]
            if draw(st.integers(min_value=0, max_value=4)) == 0:
                new = draw(a_node(f"n{added}"))
                added += 1
                fleet[new.name] = dataclasses.replace(new, reported_at=now)
                reported.append(fleet[new.name])
            # The store wrote the round before's plan (or not: a conflict, a dry run).
            if draw(st.booleans()) and written.changes_anything:
                current = written.placements
                new_current = current
            if draw(st.integers(min_value=0, max_value=3)) == 0:
                demands = draw(some_demands())
                new_demands = demands
            if draw(st.integers(min_value=0, max_value=3)) == 0:
                lifecycle = draw(a_lifecycle(current, sorted(fleet), now))
                new_lifecycle = lifecycle
        fresh_from = now - POLICY.stale_after
        changes = Changes(
            now=now,
            not_fresh={n.name: n.reported_at for n in fleet.values() if n.reported_at < fresh_from},
            nodes=reported,
            forgotten=forgotten,
            demands=new_demands,
            current=new_current,
            lifecycle=new_lifecycle,
        )
        reused = rounds.reused
        got = rounds.next(changes)
        event("reused the plan" if rounds.reused > reused else "planned again")
        assert digest(got) == _full(demands, fleet, current, now, lifecycle)
        # What the round records plans again to the same plan.
        recorded = rounds.nodes(now)
        assert {n.name for n in recorded} == set(fleet)
        assert digest(plan(demands, recorded, current, now, POLICY, lifecycle=lifecycle)) == (
            digest(got)
        )
        written = got


def test_nothing_changed_reuses_the_plan_and_a_change_plans_again() -> None:
    fleet = [node("a"), node("b"), node("c", silent_for=timedelta(seconds=100))]
    demands = [Demand("m", 2, (profile(gpus=4),))]
    rounds = IncrementalRounds()
    first = rounds.start(demands, fleet, (), NOW, POLICY)
    second = rounds.next(
        Changes(now=NOW, not_fresh={"c": NOW - timedelta(seconds=100)}, current=first.placements)
    )
    # Ten seconds on: leases renewed, nothing told but the one node still not fresh.
    later = NOW + timedelta(seconds=10)
    assert rounds.next(Changes(now=later, not_fresh={"c": NOW - timedelta(seconds=100)})) is (
        second
    )
    assert (rounds.planned, rounds.reused) == (2, 1)
    # A node reported again with the same content is no change either.
    assert (
        rounds.next(
            Changes(now=later, not_fresh={"c": NOW - timedelta(seconds=100)}, nodes=[node("a")])
        )
        is second
    )
    # Node a falls silent past stale-after: it hosts a replica, so the round plans again.
    silent = {"a": NOW, "c": NOW - timedelta(seconds=100)}
    moved = rounds.next(Changes(now=NOW + timedelta(seconds=91), not_fresh=silent))
    assert rounds.planned == 3
    truth = [
        dataclasses.replace(fleet[0], reported_at=NOW),
        dataclasses.replace(fleet[1], reported_at=NOW + timedelta(seconds=91)),
        fleet[2],
    ]
    assert digest(moved) == digest(
        plan(demands, truth, first.placements, NOW + timedelta(seconds=91), POLICY)
    )


def test_changes_before_a_start_are_refused() -> None:
    with pytest.raises(ValueError, match="start with whole inputs"):
        IncrementalRounds().next(Changes(now=NOW))
    with pytest.raises(ValueError, match="appears twice"):
        IncrementalRounds().start([], [node("a"), node("a")], (), NOW)


def test_inputs_the_planner_refuses_are_refused_again_not_answered_with_an_older_plan() -> None:
    demands = [Demand("m", 1, (profile(gpus=4),))]
    rounds = IncrementalRounds()
    rounds.start(demands, [node("a")], (), NOW, POLICY)
    twice = Changes(now=NOW, demands=[*demands, *demands])
    with pytest.raises(ValueError, match="demanded twice"):
        rounds.next(twice)
    # Nothing changed since the refused round: still refused, as a full round would be.
    with pytest.raises(ValueError, match="demanded twice"):
        rounds.next(Changes(now=NOW + timedelta(seconds=10)))


@settings(max_examples=150, deadline=None, report_multiple_bugs=False)
@given(st.data())
def test_rounds_after_nodes_lost_or_changed_are_the_full_rounds(data: st.DataObject) -> None:
    """Histories of small changes to a settled fleet, each round's plan written: nodes lost
    (silent past grace) or forgotten, back again, a node's content changed, cordons; every
    incremental round equals ``plan()`` on the whole inputs, and the rounds after a lost
    node keep the running replicas from the round before's work (``Carried``), and the
    unplaced replicas' rejection counts (``RejectionMemo``)."""
    draw = data.draw
    count = draw(st.integers(min_value=2, max_value=10))
    fleet = {f"n{i}": draw(a_node(f"n{i}")) for i in range(count)}
    demands = draw(some_demands())
    if draw(st.booleans()):
        # A gang: a node lost takes its replica off the other node too.
        demands.append(
            Demand(
                "gang",
                draw(st.integers(min_value=1, max_value=3)),
                (profile("pair", "A100", draw(st.sampled_from([1, 4])), nodes=2, memory_gb=32),),
                priority=draw(st.sampled_from([0, 1])),
            )
        )
    lifecycle = Lifecycle()
    now = NOW
    rounds = IncrementalRounds()
    current = rounds.start(demands, list(fleet.values()), (), now, POLICY).placements
    silent: set[str] = set()
    for _ in range(draw(st.integers(min_value=2, max_value=8))):
        now += timedelta(seconds=draw(st.sampled_from([10, 10, 400])))
        reported: list[Node] = []
        forgotten: list[str] = []
        new_lifecycle = None
        event_kind = draw(st.sampled_from(["lose", "lose", "back", "change", "cordon", "quiet"]))
        names = sorted(fleet)
        if event_kind == "lose" and len(fleet) > 1:
            gone = draw(st.sampled_from(names))
            if draw(st.integers(min_value=0, max_value=3)) == 0:
                del fleet[gone]
                forgotten.append(gone)
                silent.discard(gone)
            else:
                silent.add(gone)
        elif event_kind == "back" and silent:
            silent.discard(draw(st.sampled_from(sorted(silent))))
        elif event_kind == "change":
            name = draw(st.sampled_from(names))
            fleet[name] = dataclasses.replace(draw(a_node(name)), reported_at=now)
            reported.append(fleet[name])
        elif event_kind == "cordon":
            name = draw(st.sampled_from(names))
            lifecycle = Lifecycle(
                cordons={
                    name: Cordon(
                        name, draw(st.sampled_from(["cordoned", "draining"])), "ops", "", now
                    )
                }
            )
            new_lifecycle = lifecycle
        # Leases: every node not silent beats.
        for name, n in list(fleet.items()):
            if name not in silent:
                fleet[name] = dataclasses.replace(n, reported_at=now)
        fresh_from = now - POLICY.stale_after
        got = rounds.next(
            Changes(
                now=now,
                not_fresh={
                    n.name: n.reported_at for n in fleet.values() if n.reported_at < fresh_from
                },
                nodes=reported,
                forgotten=forgotten,
                current=current,
                lifecycle=new_lifecycle,
            )
        )
        assert digest(got) == _full(demands, fleet, current, now, lifecycle)
        recorded = rounds.nodes(now)
        assert digest(plan(demands, recorded, current, now, POLICY, lifecycle=lifecycle)) == (
            digest(got)
        )
        # The store writes the plan: the next round starts from it.
        current = got.placements
    event(f"kept from the round before: {min(rounds.carried.keep.hits, 3)}")
    event(f"judgement patched: {min(rounds.carried.keep.patched, 3)}")
    event(f"rejections recounted: {min(rounds.carried.rejections.recounted, 3)}")


def test_a_lost_node_keeps_the_rest_from_the_round_before() -> None:
    """A settled fleet loses a node hosting a replica: the round keeps every other replica
    from the round before's work (no replica taken from capacity again) and is the
    full round's plan."""
    fleet = [node(f"n{i}", "A100", 8) for i in range(4)]
    demands = [Demand("m", 6, (profile("big", "A100", 4),))]
    rounds = IncrementalRounds()
    first = rounds.start(demands, fleet, (), NOW, POLICY)
    later = NOW + timedelta(seconds=10)
    settled = rounds.next(Changes(now=later, current=first.placements))
    assert settled.placements == first.placements and not settled.place
    hits = rounds.carried.keep.hits
    host = settled.keep[0].nodes[0]
    lost_at = NOW + timedelta(seconds=400)
    got = rounds.next(Changes(now=lost_at, not_fresh={host: NOW}))
    assert rounds.carried.keep.hits == hits + 1
    truth = [dataclasses.replace(n, reported_at=NOW if n.name == host else lost_at) for n in fleet]
    assert digest(got) == digest(plan(demands, truth, settled.placements, lost_at, POLICY))
    assert [r.placement.nodes for r in got.remove] == [(host,), (host,)]


def test_the_nodes_planned_on_are_built_again_only_where_they_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``plan`` is given the nodes kept from the round before (``_given``): a fresh node is
    the same object round after round, though the freshness boundary moves with every
    round (before, every fresh node was built again at the boundary each round that
    planned); a node that turns stale, comes back or changes is built again, and each
    round is the full round's plan."""
    from scheduler.planner.rounds import incremental

    given: list[list[Node]] = []

    def planning(*args: object, **kwargs: object) -> object:
        given.append(list(args[1]))  # type: ignore[call-overload]
        return plan(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(incremental, "plan", planning)
    fleet = {n.name: n for n in (node("a"), node("b"), node("c"), node("d", "L4", 1))}
    demands = [Demand("m", 3, (profile(gpus=4),)), Demand("s", 1, (profile("l4", "L4", 1),))]
    rounds = IncrementalRounds()
    first = rounds.start(demands, list(fleet.values()), (), NOW, POLICY)
    current = first.placements
    host = current[0].nodes[0]
    steps = [
        ({}, []),  # fresh throughout: every node as it was given
        ({host: NOW}, []),  # the host turns stale
        ({host: NOW}, [dataclasses.replace(fleet["d"], gpus=2)]),  # d changes
        ({}, []),  # the host is back
    ]
    for i, (silent, reported) in enumerate(steps, start=1):
        now = NOW + timedelta(seconds=100 * i)
        for n in reported:
            fleet[n.name] = n
        truth = [
            dataclasses.replace(n, reported_at=silent.get(n.name, now)) for n in fleet.values()
        ]
        before = len(given)
        got = rounds.next(
            Changes(now=now, not_fresh=silent, nodes=reported, current=current, policy=POLICY)
        )
        assert digest(got) == digest(plan(demands, truth, current, now, POLICY))
        if len(given) > before:
            old, new = {n.name: n for n in given[-2]}, {n.name: n for n in given[-1]}
            rebuilt = {name for name in new if new[name] is not old[name]}
            expected = [set(), {host}, {"d"}, {host}][i - 1]
            assert rebuilt == expected, i
        current = got.placements
    assert rounds.planned >= 4


def test_the_placements_a_round_wrote_read_back_are_its_own() -> None:
    """The round after a write reads the placements back as new objects with the same
    fields: the plan's own objects are taken for them (the planner reads nothing else of
    a placement), so the models the write did not touch keep their figures from the
    round before (``ResilienceMemo``), and the round is the full round's plan."""
    fleet = [node(f"n{i}", "A100", 8) for i in range(4)] + [node("l", "L4", 8)]
    demands = [
        Demand("m", 4, (profile("big", "A100", 4),)),
        Demand("other", 2, (profile("small", "L4", 2),)),
    ]
    rounds = IncrementalRounds()
    first = rounds.start(demands, fleet, (), NOW, POLICY)
    later = NOW + timedelta(seconds=10)
    settled = rounds.next(Changes(now=later, current=first.placements))
    host = next(p.nodes[0] for p in settled.keep if p.model == "m")
    assert host != "l"
    lost_at = NOW + timedelta(seconds=400)
    got = rounds.next(Changes(now=lost_at, not_fresh={host: NOW}))
    assert got.remove and {r.placement.model for r in got.remove} == {"m"}
    read_back = tuple(dataclasses.replace(p) for p in got.placements)
    reused, patched = rounds.carried.resilience.reused, rounds.carried.keep.patched
    after = lost_at + timedelta(seconds=10)
    again = rounds.next(Changes(now=after, not_fresh={host: NOW}, current=read_back))
    truth = [dataclasses.replace(n, reported_at=NOW if n.name == host else after) for n in fleet]
    assert digest(again) == digest(plan(demands, truth, read_back, after, POLICY))
    # "other" was not touched by the write: its figure is the round before's, and its
    # placements' judgement too (KeepMemo patched: only m judged again).
    assert rounds.carried.resilience.reused == reused + 1
    assert rounds.carried.keep.patched == patched + 1


def test_a_removal_after_a_re_recorded_placement_was_written_names_what_the_store_holds() -> None:
    """A kept placement whose profile now asks for more memory is re-recorded at the new
    figure (a removal then names the stored original). Once the store holds the
    re-recorded form, a removal of it must name that form: the judgement patched after
    the write kept the round before's mapping and named the original (memory 0) when
    its node was lost, where the full round names what the store holds (memory 32).
    Found by ``scripts/hypothesis-seeds.sh`` (seed 4)."""
    fleet = {n: node(n, "A100", 1) for n in ("n0", "n1")}
    gpu = (profile("big", "A100", 1, priority=5), profile("small", "L4", 1))
    demands = [Demand("m0", 1, (cpu_profile(),)), Demand("m1", 0, (*gpu, cpu_profile()))]
    rounds = IncrementalRounds()
    first = rounds.start(demands, list(fleet.values()), (), NOW, POLICY)
    m0 = next(p for p in first.placements if p.model == "m0")
    assert (m0.profile, m0.memory_gb_per_node) == ("cpu", 0)
    # m0's CPU profile now needs 32 GB (the node's memory unknown: it stays); the first
    # plan was written.
    demands = [Demand("m0", 1, (cpu_profile(memory_gb=32),)), demands[1]]
    fleet = {n: dataclasses.replace(v, reported_at=NOW) for n, v in fleet.items()}
    second = rounds.next(
        Changes(now=NOW, not_fresh={}, demands=demands, current=first.placements, policy=POLICY)
    )
    assert digest(second) == digest(
        plan(demands, list(fleet.values()), first.placements, NOW, POLICY)
    )
    assert [p.memory_gb_per_node for p in second.placements] == [32]
    # That plan written too; then both nodes fall silent past the grace: lost.
    later = NOW + timedelta(seconds=400)
    third = rounds.next(
        Changes(
            now=later,
            not_fresh=dict.fromkeys(fleet, NOW),
            current=second.placements,
            policy=POLICY,
        )
    )
    full = plan(demands, list(fleet.values()), second.placements, later, POLICY)
    assert [r.placement.memory_gb_per_node for r in full.remove] == [32]
    assert digest(third) == digest(full)


def test_the_placements_held_are_answered_only_for_the_very_placements_given() -> None:
    """``held_for``: for the sequence last given as ``Changes.current``, the placements the
    round planned from (after a write read back, the plan's own objects, equal field by
    field); for any other sequence, even an equal one, nothing (None): a caller taking
    the answer for its placements may do so only for those it gave."""
    fleet = [node(f"n{i}", "A100", 8) for i in range(3)]
    demands = [Demand("m", 3, (profile("big", "A100", 4),))]
    rounds = IncrementalRounds()
    first = rounds.start(demands, fleet, (), NOW, POLICY)
    read_back = tuple(dataclasses.replace(p) for p in first.placements)
    later = NOW + timedelta(seconds=10)
    second = rounds.next(Changes(now=later, current=read_back))
    held = rounds.held_for(read_back)
    assert held is not None and held == read_back
    assert all(a is b for a, b in zip(held, first.placements, strict=True))
    assert all(a is b for a, b in zip(second.keep, held, strict=True))
    # An equal sequence that was not given: nothing known of it.
    assert rounds.held_for(tuple(dataclasses.replace(p) for p in read_back)) is None
    assert rounds.held_for(list(read_back)) is None
    # A round told nothing of the placements: still the sequence given last.
    rounds.next(Changes(now=later + timedelta(seconds=10)))
    assert rounds.held_for(read_back) is held
    # Placements read with a field changed: those objects, not the plan's.
    pinned = (dataclasses.replace(read_back[0], version="v2"), *read_back[1:])
    rounds.next(Changes(now=later + timedelta(seconds=20), current=pinned))
    assert rounds.held_for(pinned) == pinned
    assert rounds.held_for(pinned)[0] is pinned[0]  # type: ignore[index]
    assert rounds.held_for(read_back) is None
