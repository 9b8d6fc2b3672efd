"""Defragmentation (scheduler.planner.defrag): the fewest moves that make room, within budgets."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.definition.views import PlacementProfile
from scheduler.planner.defrag import Defrag, _Index, moves_for
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


def _apply(
    placements: list[Placement], found: Defrag, wanted: PlacementProfile = EIGHT
) -> list[Placement]:
    moved = {(m.placement.model, m.placement.replica): m.to for m in found.moves}
    out = [
        Placement(p.model, p.replica, p.profile, (moved[(p.model, p.replica)],), 1, "T4")
        if (p.model, p.replica) in moved
        else p
        for p in placements
    ]
    assert found.node is not None
    nodes = found.nodes or (found.node,)
    assert len(nodes) == wanted.nodes
    return [*out, Placement("big", 0, wanted.name, nodes, wanted.gpus_per_node, "T4")]


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


GANG = profile("t4x8x2", "T4", 8, nodes=2)


def test_a_gangs_nodes_share_a_fabric_and_only_the_one_that_can_be_cleared_is() -> None:
    # a0 and b0 are empty, but on two fabrics: no gang spans them. a1 runs replicas that
    # may not move; b1 runs seven that may. c0 and c1 (no fabric) take the moves.
    nodes = [
        node("a0", "T4", 8, fabric="A"),
        node("a1", "T4", 8, fabric="A"),
        node("b0", "T4", 8, fabric="B"),
        node("b1", "T4", 8, fabric="B"),
        node("c0", "T4", 8),
        node("c1", "T4", 8),
    ]
    placements = [
        *(Placement("pinned", r, "t4", ("a1",), 1, "T4") for r in range(6)),
        *(Placement("small", r, "t4", ("b1",), 1, "T4") for r in range(7)),
    ]
    found = _defrag(nodes, placements, movable={"pinned": False}, wanted=GANG)
    assert found.nodes == ("b0", "b1") and found.node == "b0"
    assert len(found.moves) == 7
    assert {m.placement.model for m in found.moves} == {"small"}
    # Never onto either of the gang's nodes; a0 (free, other fabric) may take some.
    assert not {m.to for m in found.moves} & {"b0", "b1"}
    assert all(
        m.reason == "to make room for model big, profile t4x8x2 on node b1" for m in found.moves
    )
    assert overcommitted(_apply(placements, found, GANG), nodes) == []
    # With b1's replicas unmovable too, no fabric can be cleared and the refusal says why.
    none = _defrag(nodes, placements, movable={"pinned": False, "small": False}, wanted=GANG)
    assert none.node is None and none.moves == () and none.nodes == ()
    assert none.refusal.startswith("no 2 nodes of one fabric can be cleared")


def test_a_gang_counts_the_room_its_earlier_moves_took() -> None:
    # Four nodes on one fabric, 5 one-card replicas on each: 12 cards free in all, 3 a
    # node. Clearing two nodes moves 10 replicas onto the other two, which hold 6: it
    # cannot be done, though each node alone could be cleared (5 moves onto 6 free).
    nodes = [node(f"n{i}", "T4", 8, fabric="f") for i in range(4)]
    placements = [Placement("small", r, "t4", (f"n{r % 4}",), 1, "T4") for r in range(20)]
    assert _defrag(nodes, placements).node is not None
    found = _defrag(nodes, placements, wanted=GANG)
    assert found.node is None and found.moves == ()
    # Two more nodes off the fabric give the moves room: 10 moves, onto the four others.
    more = [*nodes, node("x0", "T4", 8), node("x1", "T4", 8)]
    found = _defrag(more, placements, wanted=GANG)
    assert found.nodes == ("n0", "n1") and len(found.moves) == 10
    landed = Counter(m.to for m in found.moves)
    assert set(landed) <= {"n2", "n3", "x0", "x1"}
    assert overcommitted(_apply(placements, found, GANG), more) == []


def test_a_gangs_budget_is_counted_over_all_its_nodes_and_named() -> None:
    nodes = [node(f"n{i}", "T4", 8, fabric="f") for i in range(8)]
    placements = [Placement("small", r, "t4", (f"n{r % 8}",), 1, "T4") for r in range(32)]
    # 8 moves are needed (4 on each of two nodes): 7 in motion are not enough.
    found = _defrag(nodes, placements, budget={"small": 7}, wanted=GANG)
    assert found.node is None and found.moves == ()
    assert found.blocked == ("small",)
    assert "the disruption budget of small stood in the way" in found.refusal
    assert len(_defrag(nodes, placements, budget={"small": 8}, wanted=GANG).moves) == 8


@settings(max_examples=80, deadline=None)
@given(
    # One-card replicas per node (dense enough that most wanted replicas need moves), and
    # whose each is, in order.
    fill=st.lists(st.integers(3, 8), min_size=5, max_size=5),
    owners=st.lists(st.sampled_from(["a", "b"]), min_size=40, max_size=40),
    priority_b=st.integers(-1, 1),
    budget_a=st.one_of(st.none(), st.integers(0, 4)),
    wanted=st.integers(3, 8),
    size=st.sampled_from([1, 1, 2, 3]),
)
def test_property_no_overcommit_no_higher_priority_moved_and_replayable(  # noqa: PLR0917
    fill: list[int],
    owners: list[str],
    priority_b: int,
    budget_a: int | None,
    wanted: int,
    size: int,
) -> None:
    # Two fabrics (n0-n2, n3-n4) for a gang demand (size > 1); a single node ignores them.
    fabric = {f"n{i}": "f0" if i < 3 else "f1" for i in range(5)}
    nodes = [node(f"n{i}", "T4", 8, fabric=fabric[f"n{i}"]) for i in range(5)]
    placements: list[Placement] = []
    for where, many in enumerate(fill):
        for _ in range(many):
            i = len(placements)
            placements.append(Placement(owners[i], i, "t4", (f"n{where}",), 1, "T4"))
    budget = {} if budget_a is None else {"a": budget_a}
    want = profile("want", "T4", wanted, nodes=size)
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
    assert len(found.nodes) == size
    assert len({fabric[n] for n in found.nodes}) == 1
    assert not {m.to for m in found.moves} & set(found.nodes)
    assert all(not (m.placement.model == "b" and priority_b > 0) for m in found.moves)
    if budget_a is not None:
        assert sum(m.placement.model == "a" for m in found.moves) <= budget_a
    assert overcommitted(_apply(placements, found, want), nodes) == []


@settings(max_examples=80, deadline=None)
@given(
    fill=st.lists(st.integers(0, 8), min_size=5, max_size=5),
    owners=st.lists(st.sampled_from(["a", "b", "c"]), min_size=40, max_size=40),
    budget_a=st.none() | st.integers(0, 2),
    stuck=st.booleans(),
    avoid=st.sets(st.sampled_from([f"n{i}" for i in range(5)]), max_size=2),
    wanted=st.integers(1, 8),
)
def test_property_searches_sharing_a_round_answer_as_each_alone(  # noqa: PLR0917
    fill: list[int],
    owners: list[str],
    budget_a: int | None,
    stuck: bool,
    avoid: set[str],
    wanted: int,
) -> None:
    # The round's step searches for many models with one index (each node searched once a
    # shape, its own replicas' nodes again for each model): every answer, refusal and what
    # stood in the way included, is the one a search of its own gives, and keeps the rules
    # a search for a model running nowhere would not see.
    nodes = [node(f"n{i}", "T4", 8) for i in range(5)]
    placements: list[Placement] = []
    for where, many in enumerate(fill):
        for _ in range(many):
            i = len(placements)
            placements.append(Placement(owners[i], i, "t4", (f"n{where}",), 1, "T4"))
    capacity = _capacity(nodes, placements)
    want = profile("want", "T4", wanted)
    shared = _Index(placements, lambda _model, name: name, ())
    budget = {} if budget_a is None else {"a": budget_a}
    movable = {"c": False} if stuck else {}
    profiles = {(m, "t4"): ONE for m in ("a", "b", "c")}

    def search(model: str, priority: int, shun: frozenset[str], index: _Index | None) -> Defrag:
        return moves_for(
            model, priority, want, capacity, placements,
            priorities={"b": 1}, budget=budget, profiles=profiles, movable=movable,
            avoid=shun, index=index,
        )  # fmt: skip

    for model, priority in (("a", 0), ("b", 1), ("c", 0), ("big", 0), ("a", 1), ("big", 1)):
        for shun in (frozenset(), frozenset(avoid)):
            alone = search(model, priority, shun, None)
            assert search(model, priority, shun, shared) == alone, (model, priority, sorted(shun))
            # Never its own replicas, nor a higher priority's, nor a model that may not move.
            assert all(
                m.placement.model not in {model, "c" if stuck else ""}
                and not (m.placement.model == "b" and priority < 1)
                for m in alone.moves
            )
            assert alone.node not in shun
            if alone.node is None and stuck and model != "c":
                # Refused: a replica of "c" (not movable) on any node searched is named.
                there = {p.nodes[0] for p in placements if p.model == "c"} - shun
                assert ("c" in alone.blocked) == bool(there), alone
