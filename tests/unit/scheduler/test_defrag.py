"""Defragmentation (scheduler.planner.defrag): the fewest moves that make room, within budgets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.views import PlacementProfile
from scheduler.planner.defrag import Defrag, moves_for
from scheduler.planner.fleet.capacity import Capacity
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Placement
from tests.unit.scheduler.placement_builders import node, overcommitted, profile

ONE = profile("t4", "T4", 1)
EIGHT = profile("t4x8", "T4", 8)


def _capacity(nodes: list[Node], placements: list[Placement]) -> Capacity:
    capacity = Capacity(nodes, {n.name for n in nodes})
    for p in placements:
        capacity.consume(p.nodes, p.gpus_per_node, p.memory_gb_per_node)
    return capacity


def _fragmented() -> tuple[list[Node], list[Placement]]:
    nodes = [node(f"n{i}", "T4", 8) for i in range(8)]
    return nodes, [Placement("small", r, "t4", (f"n{r % 8}",), 1, "T4") for r in range(56)]


def _defrag(
    nodes: list[Node],
    placements: list[Placement],
    *,
    budget: dict[str, int] | None = None,
    movable: dict[str, bool] | None = None,
    priorities: dict[str, int] | None = None,
    wanted: PlacementProfile = EIGHT,
) -> Defrag:
    models = {p.model for p in placements}
    return moves_for(
        "big",
        0,
        wanted,
        _capacity(nodes, placements),
        placements,
        priorities=priorities or {},
        budget=budget or {},
        profiles={(m, "t4"): ONE for m in models},
        movable=movable,
    )


def _apply(placements: list[Placement], found: Defrag) -> list[Placement]:
    moved = {(m.placement.model, m.placement.replica): m.to for m in found.moves}
    out = [
        Placement(p.model, p.replica, p.profile, (moved[(p.model, p.replica)],), 1, "T4")
        if (p.model, p.replica) in moved
        else p
        for p in placements
    ]
    assert found.node is not None
    return [*out, Placement("big", 0, "t4x8", (found.node,), 8, "T4")]


def test_the_fragmented_cluster_is_cleared_by_seven_moves() -> None:
    nodes, placements = _fragmented()
    found = _defrag(nodes, placements)
    # Seven moves, the fewest possible (CP-SAT proves 7 in test_exact_reference).
    assert found.node == "n0"
    assert len(found.moves) == 7
    assert {m.to for m in found.moves} == {f"n{i}" for i in range(1, 8)}
    assert all(
        m.reason == "to make room for model big, profile t4x8 on node n0" for m in found.moves
    )
    assert overcommitted(_apply(placements, found), nodes) == []


def test_a_model_whose_budget_forbids_moves_is_never_moved_and_the_refusal_names_it() -> None:
    nodes, placements = _fragmented()
    for found in (
        _defrag(nodes, placements, budget={"small": 0}),
        _defrag(nodes, placements, budget={"small": 6}),
    ):
        assert found.node is None and found.moves == ()
        assert "disruption budget of small" in found.refusal
    off = _defrag(nodes, placements, movable={"small": False})
    assert off.node is None and off.moves == ()


def test_higher_priority_replicas_are_never_moved() -> None:
    nodes, placements = _fragmented()
    found = _defrag(nodes, placements, priorities={"small": 1})
    assert found.node is None


@settings(max_examples=60, deadline=None)
@given(
    layout=st.lists(st.tuples(st.integers(0, 4), st.sampled_from(["a", "b"])), max_size=30),
    priority_b=st.integers(-1, 1),
    budget_a=st.one_of(st.none(), st.integers(0, 4)),
    wanted=st.integers(2, 8),
)
def test_property_no_overcommit_no_higher_priority_moved_and_replayable(
    layout: list[tuple[int, str]], priority_b: int, budget_a: int | None, wanted: int
) -> None:
    nodes = [node(f"n{i}", "T4", 8) for i in range(5)]
    placements: list[Placement] = []
    used = dict.fromkeys(range(5), 0)
    for i, (where, model) in enumerate(layout):
        if used[where] < 8:
            used[where] += 1
            placements.append(Placement(model, i, "t4", (f"n{where}",), 1, "T4"))
    budget = {} if budget_a is None else {"a": budget_a}
    want = profile("want", "T4", wanted)
    found = _defrag(nodes, placements, budget=budget, priorities={"b": priority_b}, wanted=want)
    again = _defrag(
        list(reversed(nodes)),
        list(reversed(placements)),
        budget=budget,
        priorities={"b": priority_b},
        wanted=want,
    )
    assert found == again
    if found.node is None:
        return
    assert all(not (m.placement.model == "b" and priority_b > 0) for m in found.moves)
    if budget_a is not None:
        assert sum(m.placement.model == "a" for m in found.moves) <= budget_a
    after = _apply(placements, found)
    after[-1] = Placement("big", 0, "want", (found.node,), wanted, "T4")
    assert overcommitted(after, nodes) == []
