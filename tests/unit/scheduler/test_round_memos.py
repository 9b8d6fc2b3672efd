"""Small memos of a round's work: each reused only for the very inputs it was made from."""

from __future__ import annotations

import pytest

from scheduler.daemon.round_runner import _pinned_now, _writes
from scheduler.planner import order
from scheduler.planner.fleet.placements import Demand, Placement, Plan, changed_from, not_among
from scheduler.planner.order import placement_order
from scheduler.planner.resilience import ResilienceMemo, resilience
from tests.unit.scheduler.placement_builders import node, profile


def test_the_placement_order_is_kept_for_the_very_same_demands_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round orders its demands several times, and a daemon's rounds the same Demand
    objects round after round: ordered once while they are the very same objects, in the
    same order; any other demands (even as many, even equal) are ordered afresh."""
    keys = 0
    key = order._key

    def counting(demand: Demand, index: int) -> tuple[int, int, int, int]:
        nonlocal keys
        keys += 1
        return key(demand, index)

    monkeypatch.setattr(order, "_key", counting)
    small, large = Demand("small", 1, (profile(gpus=1),)), Demand("large", 1, (profile(gpus=4),))
    demands = [small, large]
    assert placement_order(demands) == [large, small]
    assert keys == 2
    # The same objects (another sequence holding them): kept, not ordered again.
    assert placement_order(tuple(demands)) == [large, small]
    assert keys == 2
    # As many demands, other objects: ordered afresh.
    larger = Demand("small", 1, (profile(gpus=8),))
    assert placement_order([larger, large]) == [larger, large]
    # Equal but not the same objects: ordered afresh too (and the same order).
    again = [Demand("small", 1, (profile(gpus=1),)), Demand("large", 1, (profile(gpus=4),))]
    assert placement_order(again) == [again[1], again[0]]
    assert keys == 6
    # In another order: another order.
    assert placement_order([large, small]) == [large, small]


def _placement(model: str, replica: int, node: str) -> Placement:
    return Placement(model, replica, "p", (node,), 1, "A100")


def test_a_plan_keeping_the_very_placements_read_writes_nothing() -> None:
    before = (_placement("m", 0, "a"), _placement("m", 1, "b"))
    assert not _writes(Plan(keep=before, place=(), remove=(), unplaced=()), before)
    # Equal placements, other objects (read again): nothing to write either.
    equal = tuple(_placement(p.model, p.replica, p.nodes[0]) for p in before)
    assert not _writes(Plan(keep=equal, place=(), remove=(), unplaced=()), before)
    # One kept under another version: written.
    pinned = (before[0], Placement("m", 1, "p", ("b",), 1, "A100", version="v2"))
    assert _writes(Plan(keep=pinned, place=(), remove=(), unplaced=()), before)


def test_a_models_resilience_is_kept_only_while_what_it_reads_is_the_same() -> None:
    """``ResilienceMemo``: a model's figure is the round before's while its Demand and its
    placements are the very same objects and, spread by a label, the nodes' content is
    the same version; else computed again, and always the figure computed afresh."""
    nodes = {
        n.name: n
        for n in (
            node("a", labels={"zone": "eu"}),
            node("b", labels={"zone": "eu"}),
            node("c", labels={"zone": "us"}),
        )
    }
    spread = Demand("s", 2, (profile(gpus=1),), spread_by="zone")
    plain = Demand("p", 2, (profile(gpus=1),))
    placed = [
        _placement("s", 0, "a"),
        _placement("s", 1, "b"),
        _placement("p", 0, "a"),
        _placement("p", 1, "c"),
    ]
    memo = ResilienceMemo()
    first = resilience([spread, plain], placed, nodes, memo=memo, inventory_version=1)
    assert first == resilience([spread, plain], placed, nodes)
    assert [(r.nodes, r.domains) for r in first] == [(2, 1), (2, None)]
    assert memo.reused == 0
    # The same objects: both kept.
    assert resilience([spread, plain], placed, nodes, memo=memo, inventory_version=1) == first
    assert memo.reused == 2
    # Node b moved to another zone (the content's version moved): the spread model is
    # computed again (2 zones now), the other kept.
    moved = {**nodes, "b": node("b", labels={"zone": "us"})}
    got = resilience([spread, plain], placed, moved, memo=memo, inventory_version=2)
    assert got == resilience([spread, plain], placed, moved)
    assert [(r.nodes, r.domains) for r in got] == [(2, 2), (2, None)]
    assert memo.reused == 3
    # A placement of p read again (an equal but other object), one of s on another node.
    again = [
        _placement("s", 0, "a"),
        _placement("s", 1, "a"),
        *placed[2:3],
        _placement("p", 1, "c"),
    ]
    got = resilience([spread, plain], again, moved, memo=memo, inventory_version=2)
    assert got == resilience([spread, plain], again, moved)
    assert [(r.nodes, r.domains) for r in got] == [(1, 1), (2, None)]
    assert memo.reused == 3
    # No version known: a spread model is never kept.
    resilience([spread], again, moved, memo=memo, inventory_version=None)
    resilience([spread], again, moved, memo=memo, inventory_version=None)
    assert memo.reused == 3


def test_the_placements_pinned_now_are_those_placed_or_kept_under_another_version() -> None:
    """``_pinned_now`` finds, by identity first, the kept placements that are not the very
    objects read and, of those, the ones whose version differs from the one read (or that
    were not read): the same list the index of every placement by slot gave."""
    read = (
        _placement("m", 0, "a"),
        _placement("m", 1, "b"),
        Placement("n", 0, "p", ("c",), 1, "A100", version="v1"),
    )
    placed = _placement("m", 2, "c")
    # Every kept placement the very object read: only what is placed.
    plan = Plan(keep=read, place=(placed,), remove=(), unplaced=())
    assert _pinned_now(plan, read) == [placed]
    # Read again (equal, other objects, the same versions): nothing pinned now either.
    equal = tuple(
        Placement(p.model, p.replica, "p", p.nodes, 1, "A100", version=p.version) for p in read
    )
    assert _pinned_now(Plan(keep=equal, place=(), remove=(), unplaced=()), read) == []
    # One kept under another version, one kept that was not read: both, in keep's order.
    pinned = Placement("n", 0, "p", ("c",), 1, "A100", version="v2")
    unread = Placement("o", 0, "p", ("d",), 1, "A100", version="v2")
    plan = Plan(keep=(read[0], pinned, unread), place=(placed,), remove=(), unplaced=())
    assert _pinned_now(plan, read) == [placed, pinned, unread]


def test_not_among_is_by_identity_in_order() -> None:
    one, two = _placement("m", 0, "a"), _placement("m", 1, "b")
    again = _placement("m", 0, "a")
    assert not_among([one, again, two], [two, one]) == [again]
    assert not_among([], [one]) == [] and not_among([one], []) == [one]


def test_a_diff_is_answered_again_only_for_the_very_same_objects() -> None:
    """``changed_from`` answers a call whose sequences hold the very objects of a recent
    call's, in order, as that call was answered (a round's memos diff the same kept
    placements three times); any other objects, even equal ones, are diffed afresh, and
    the caller's changes to an answer do not reach the next."""
    one, two, three = _placement("m", 0, "a"), _placement("m", 1, "b"), _placement("m", 2, "c")
    old = [one, two]
    assert changed_from(old, [two, three]) == ([one], [three])
    answer = changed_from(list(old), (two, three))
    assert answer == ([one], [three])
    answer[0].clear()
    assert changed_from(old, [two, three]) == ([one], [three])
    # Equal, other objects: another diff (two is gone, its copy came).
    again = _placement("m", 1, "b")
    assert changed_from(old, [again, three]) == ([one, two], [again, three])
    assert changed_from(old, [two, one]) is None  # not in the same order


def test_not_among_is_answered_again_only_for_the_very_same_objects() -> None:
    """Asked twice a round of the same plan and placements: the second answer is the
    first's, a copy; any other objects, even equal ones, are looked at afresh."""
    one, two = _placement("m", 0, "a"), _placement("m", 1, "b")
    again = _placement("m", 0, "a")
    assert not_among([one, two], [two]) == [one]
    answer = not_among((one, two), [two])
    assert answer == [one]
    answer.clear()
    assert not_among([one, two], (two,)) == [one]
    (found,) = not_among([again, two], [two])  # equal to one, another object
    assert found is again
    assert not_among([again, two], [two, again]) == []


def test_a_models_explanation_is_the_round_befores_only_while_it_says_the_same() -> None:
    """``ExplainMemo``: a model whose unplaced replicas, notes, reason and counts are the
    round before's keeps its ``Unplaced`` objects; one whose counts or reason moved (a
    node came) is explained again, and every plan is ``plan``'s without the memo."""
    from dataclasses import replace
    from datetime import timedelta

    from scheduler.planner.plan import Carried, plan
    from tests.unit.scheduler.placement_builders import NOW

    nodes = [node("n0", "A100", 4)]
    demands = [
        Demand("big", 2, (profile("four", "A100", 4),)),
        Demand("huge", 1, (profile("eight", "A100", 8),)),
    ]
    carried = Carried(inventory=1)
    first = plan(demands, nodes, (), NOW, carried=carried)
    assert [(u.model, u.replica) for u in first.unplaced] == [("big", 1), ("huge", 0)]
    later = NOW + timedelta(seconds=10)
    nodes = [replace(n, reported_at=later) for n in nodes]
    again = plan(demands, nodes, first.placements, later, carried=carried)
    assert again.unplaced == plan(demands, nodes, first.placements, later).unplaced
    assert all(a is b for a, b in zip(again.unplaced, first.unplaced, strict=True))
    # A node of 8 cards, full: every model's counts move (one more node examined).
    nodes = [*nodes, node("n1", "A100", 8, reserved=8)]
    carried.inventory = 2
    moved = plan(demands, nodes, first.placements, later, carried=carried)
    assert moved.unplaced == plan(demands, nodes, first.placements, later).unplaced
    assert moved.unplaced != again.unplaced
    assert not any(a is b for a, b in zip(moved.unplaced, again.unplaced, strict=True))


def test_the_reasons_of_the_very_unplaced_judged_before_are_taken_again() -> None:
    """``Placer._reasons_of``: the reason of an ``Unplaced`` the last judged plan held is
    that reason (the same object); any other, even of the same replica, is made afresh."""
    from scheduler.daemon.round_runner import Placer
    from scheduler.persistence.outcome_store import reasons_of
    from scheduler.planner.fleet.placements import Unplaced

    kept, moved = Unplaced("m", 0, "no room", ()), Unplaced("m", 1, "no room", ())
    placer = object.__new__(Placer)
    placer._judged = None
    before = Plan(keep=(), place=(), remove=(), unplaced=(kept, moved))
    reasons = placer._reasons_of(before.unplaced)
    assert reasons == reasons_of(before.unplaced)
    placer._judged = (before, (), False, reasons)
    now = (kept, Unplaced("m", 1, "no room; a node came", ()), Unplaced("n", 0, "none", ()))
    got = placer._reasons_of(now)
    assert got == reasons_of(now)
    assert got[0] is reasons[0] and got[1] is not reasons[1]
