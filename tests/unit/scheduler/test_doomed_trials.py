"""A node's trial known to fail without being made (``defrag._doomed``) is the trial made.

A trial moves the replicas on a node elsewhere to make room; a move lands only on one of
its victim profile's best-fitting nodes, so when the cards of the candidates that have
any, with the node's own, are fewer than the replica needs, the trial fails, and what it
says (the budgets that stood in the way, the destination lists it read) is known
without trying a move, except for a model with a budget and room to move to.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.planner import defrag
from scheduler.planner.defrag import _domains, _Index, moves_for
from scheduler.planner.fleet.capacity import Capacity
from scheduler.planner.fleet.placements import Placement
from tests.unit.scheduler.test_carried_indexes import FLEET, MOVED, SIZES, held

PRIORITIES = {d.model: d.priority for d in MOVED}
PROFILES = {(d.model, p.name): p for d in MOVED for p in d.profiles}


def _searched(
    placed: list[Placement], capacity: Capacity, budget: dict[str, int]
) -> tuple[list[Any], _Index]:
    """Every demand's ``moves_for`` of every profile on one fresh index, and the index."""
    domain = _domains(MOVED, FLEET)
    index = _Index(placed, domain, {"a"})
    found = [
        moves_for(
            d.model,
            d.priority,
            shape,
            capacity,
            placed,
            priorities=PRIORITIES,
            budget=budget,
            profiles=PROFILES,
            domain=domain,
            required={"a"},
            index=index,
        )
        for d in MOVED
        for shape in d.profiles
    ]
    return found, index


def _made(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every trial made (the shortcut off)."""
    monkeypatch.setattr(defrag, "_doomed", lambda *args, **kwargs: None)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_trial_known_to_fail_is_the_trial_made(data: st.DataObject) -> None:
    """On random fleets, rooms and budgets: the same answers, and the same record of every
    trial (what the next round's ``_still_holds`` reads), with the shortcut and without."""
    draw = data.draw
    placed = draw(held())
    fresh = set(FLEET) - set(draw(st.lists(st.sampled_from(sorted(FLEET)), max_size=2)))

    def capacity() -> Capacity:
        c = Capacity(list(FLEET.values()), fresh)
        for p in placed:
            c.consume(p.nodes, p.gpus_per_node, p.memory_gb_per_node)
        return c

    room = capacity()
    taken = draw(
        st.lists(st.tuples(st.sampled_from(sorted(FLEET)), st.integers(-2, 6)), max_size=5)
    )
    budget = {
        m: draw(st.integers(0, 2))
        for m in draw(st.lists(st.sampled_from(sorted(SIZES)), unique=True))
    }
    for name, gpus in taken:
        room.consume((name,), gpus, 10 * max(gpus, 0))
    got, index = _searched(placed, room, budget)
    with pytest.MonkeyPatch.context() as patch:
        _made(patch)
        other = capacity()
        for name, gpus in taken:
            other.consume((name,), gpus, 10 * max(gpus, 0))
        want, made = _searched(placed, other, budget)
    assert got == want
    assert index.cleared == made.cleared
    assert made.doomed == 0


def _b_twice_on_n3() -> tuple[list[Placement], Capacity]:
    """n3: two replicas of b (2 cards, 20 GB each) and one of d (4 cards, 40 GB); n0: 4
    cards and 30 GB free, room for one of b and none for d; every other node full. e's
    whole node (8 cards) cannot be made on n3: b's replicas free 4 cards at most."""
    placed = [
        *(Placement("b", r, "two", ("n3",), 2, "A100", 20) for r in (0, 1)),
        Placement("d", 0, "four", ("n3",), 4, "A100", 40),
    ]
    capacity = Capacity(list(FLEET.values()), set(FLEET))
    capacity.consume(("n3",), 8, 80)
    capacity.consume(("n0",), 4, 50)
    for name in ("n1", "n2", "n4", "n5", "n6", "n7"):
        capacity.consume((name,), 8, 80)
    return placed, capacity


def test_a_model_with_a_budget_and_room_to_move_to_is_tried() -> None:
    """b may put one replica in motion: the trial moves the first to n0 and then b's
    budget stands in the way of the second, which only the trial says (a shortcut taking
    b's budget, 1, for not spent would name nothing in the way)."""
    placed, capacity = _b_twice_on_n3()
    eight = MOVED[-1].profiles[0]
    domain = _domains(MOVED, FLEET)
    index = _Index(placed, domain, {"a"})
    found = moves_for(
        "e", 1, eight, capacity, placed, priorities=PRIORITIES, budget={"b": 1},
        profiles=PROFILES, domain=domain, required={"a"}, index=index,
    )  # fmt: skip
    assert found.node is None and found.blocked == ("b",)
    assert index.doomed == 0


def test_a_trial_that_cannot_free_enough_cards_is_not_made() -> None:
    """Without a budget, the same node is known to fail (4 cards at most of 8: d has
    nowhere to go) and is not tried; with b's budget at 0 too, b named as in the way."""
    eight = MOVED[-1].profiles[0]
    domain = _domains(MOVED, FLEET)
    for budget, blocked in (({}, ()), ({"b": 0}, ("b",))):
        placed, capacity = _b_twice_on_n3()
        index = _Index(placed, domain, {"a"})
        found = moves_for(
            "e", 1, eight, capacity, placed, priorities=PRIORITIES, budget=budget,
            profiles=PROFILES, domain=domain, required={"a"}, index=index,
        )  # fmt: skip
        assert found.node is None and found.blocked == blocked
        assert index.doomed == 1
