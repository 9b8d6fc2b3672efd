"""A round's indexes patched from the round before's are the indexes built afresh.

When a round keeps the same placements less a few (a node lost), the spread counts
(``SpreadMemo``) and the defragmentation's index (``IndexMemo``) are the round before's
with those few taken out; they must be exactly what counting the rest gives.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.planner.defrag import IndexMemo, _domains, _Index
from scheduler.planner.fleet.placements import Demand, Placement, removed_from
from scheduler.planner.spread import Spread, SpreadMemo
from tests.unit.scheduler.placement_builders import node, profile

NODES = {f"n{i}": node(f"n{i}", labels={"zone": "eu" if i % 3 else "us"}) for i in range(6)}
DEMANDS = [
    Demand("a", 4, (profile("one", "A100", 1),), spread_by="zone", spread_required=True),
    Demand("b", 4, (profile("two", "A100", 2),)),
    Demand("c", 2, (profile("pair", "A100", 4, nodes=2),), spread_by="zone"),
]


# The strategies drawn from below, made once (as in test_round_chain.py): built inline,
# each draw made new strategy objects for Hypothesis to validate and label again.
_NODE = st.sampled_from(sorted(NODES))
_ON_NODES = {size: st.lists(_NODE, min_size=size, max_size=size, unique=True) for size in (1, 2)}
_MEMORY = st.sampled_from([0, 8])
_0_TO_3 = st.integers(min_value=0, max_value=3)
_0_TO_5 = st.integers(min_value=0, max_value=5)


@functools.cache
def _position(length: int) -> st.SearchStrategy[int]:
    return st.integers(min_value=0, max_value=length)


@st.composite
def placements(draw: st.DrawFn) -> list[Placement]:
    out = []
    for model, gpus, size in (("a", 1, 1), ("b", 2, 1), ("c", 4, 2)):
        for replica in range(draw(_0_TO_5)):
            nodes = tuple(draw(_ON_NODES[size]))
            out.append(Placement(model, replica, "p", nodes, gpus, "A100", draw(_MEMORY)))
    return out


def _index_view(index: _Index) -> tuple[object, ...]:
    return (
        {n: list(map(id, ps)) for n, ps in index.on_node.items()},
        {k: v for k, v in index.spread.count.items() if v},
        index.hosts,
    )


def _with_added(draw: Any, kept: list[Placement], new: list[Placement]) -> list[Placement]:
    """``kept`` with a few of ``new`` (other objects) inserted at drawn places, in order."""
    out = list(kept)
    for p in new[: draw(_0_TO_3)]:
        out.insert(draw(_position(len(out))), p)
    return out


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_indexes_less_the_placements_gone_are_the_indexes_of_the_rest(
    data: st.DataObject,
) -> None:
    draw = data.draw
    before = draw(placements())
    domain = _domains(DEMANDS, NODES)
    required = {"a"}
    spread_memo, index_memo = SpreadMemo(), IndexMemo()
    spread_memo.of(DEMANDS, NODES, before, "v")
    index_memo.index_of(before, DEMANDS, "v", domain, required)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        after = [p for p in before if draw(st.integers(min_value=0, max_value=3)) > 0]
        assert removed_from(before, after) is not None
        # A write's placements read back in the round after: new objects, anywhere.
        after = _with_added(draw, after, draw(placements()))
        got = spread_memo.of(DEMANDS, NODES, after, "v")
        fresh = Spread.of(DEMANDS, NODES, after)
        assert (got.on_node, got.in_domain) == (fresh.on_node, fresh.in_domain)
        index = index_memo.index_of(after, DEMANDS, "v", domain, required)
        assert _index_view(index) == _index_view(_Index(after, domain, required))
        before = after
    assert spread_memo.patched > 0 and index_memo.patched > 0


# A fleet where replicas must be moved to make room: 8 cards a node, replicas of 1, 2 and
# 4 cards, and a model of higher priority asking for a whole node (or two).
MOVED = [
    Demand("a", 4, (profile("one", "A100", 1),), spread_by="zone", spread_required=True),
    Demand("b", 4, (profile("two", "A100", 2),), spread_by="zone"),
    Demand("d", 2, (profile("four", "A100", 4, memory_gb=40),)),
    Demand("e", 1, (profile("eight", "A100", 8), profile("gang", "A100", 8, nodes=2)), priority=1),
]
SIZES = {"a": (1, "one"), "b": (2, "two"), "d": (4, "four")}
FLEET = {
    f"n{i}": node(f"n{i}", labels={"zone": "eu" if i % 3 else "us"}, memory_gb=80, fabric="f")
    for i in range(8)
}

# The strategies `held` and the trials' test draw from, made once (as above).
_0_TO_6 = st.integers(min_value=0, max_value=6)
_FLEET_NODE = st.sampled_from(sorted(FLEET))


@st.composite
def held(draw: st.DrawFn) -> list[Placement]:
    out = []
    for model, (gpus, name) in SIZES.items():
        for replica in range(draw(_0_TO_6)):
            where = draw(_FLEET_NODE)
            out.append(Placement(model, replica, name, (where,), gpus, "A100", 10 * gpus))
    return out


@pytest.mark.slow  # (tests/xdist_groups.py: handed out first)
@settings(max_examples=300, deadline=None)
@given(st.data())
def test_trials_carried_from_the_round_before_are_the_trials_made_afresh(
    data: st.DataObject,
) -> None:
    """``moves_for`` on an index patched from the round before's (its trials taken again
    where what they read is the same) is ``moves_for`` on an index built afresh, round
    after round, as placements go, nodes go stale, room changes and budgets move."""
    from scheduler.planner.defrag import moves_for
    from scheduler.planner.fleet.capacity import Capacity

    draw = data.draw
    before = draw(held())
    domain = _domains(MOVED, FLEET)
    required = {"a"}
    memo = IndexMemo()
    priorities = {d.model: d.priority for d in MOVED}
    profiles = {(d.model, p.name): p for d in MOVED for p in d.profiles}
    for round_ in range(draw(st.integers(min_value=2, max_value=5))):
        after = before if round_ == 0 else [p for p in before if draw(st.integers(0, 5)) > 0]
        if round_ and draw(st.booleans()):
            after = _with_added(draw, after, draw(held()))
        fresh = set(FLEET) - set(draw(st.lists(st.sampled_from(sorted(FLEET)), max_size=2)))
        capacity = Capacity(list(FLEET.values()), fresh)
        for p in after:
            capacity.consume(p.nodes, p.gpus_per_node, p.memory_gb_per_node)
        for name in draw(st.lists(st.sampled_from(sorted(FLEET)), max_size=4)):
            capacity.consume((name,), draw(st.integers(-2, 3)), draw(st.sampled_from([0, 10])))
        budget = {
            m: draw(st.integers(0, 2))
            for m in draw(st.lists(st.sampled_from(sorted(SIZES)), unique=True))
        }
        carried = memo.index_of(after, MOVED, "v", domain, required)
        afresh = _Index(after, domain, required)
        for demand in MOVED:
            for shape in demand.profiles:
                common: dict[str, Any] = {
                    "priorities": priorities,
                    "budget": budget,
                    "profiles": profiles,
                    "domain": domain,
                    "required": required,
                }
                got = moves_for(
                    demand.model, demand.priority, shape, capacity, after, index=carried, **common
                )
                want = moves_for(
                    demand.model, demand.priority, shape, capacity, after, index=afresh, **common
                )
                assert got == want
        before = after


def test_a_node_lost_leaves_the_other_nodes_trials_as_they_were() -> None:
    """The round after a node is lost tries again only what read that node: every other
    node's trial is the round before's (on the old tree every trial was made again)."""
    from scheduler.planner.defrag import moves_for
    from scheduler.planner.fleet.capacity import Capacity

    # Every node runs a replica of a and of b, but n6, full of d's: losing n6 changes
    # neither the others' room nor anyone's destinations, nor the spread of a or b.
    before = [
        Placement(model, i, name, (f"n{i}",), gpus, "A100", 10 * gpus)
        for i in range(8)
        for model, (gpus, name) in SIZES.items()
        if (model == "d") == (i == 6)
    ]
    before.append(Placement("d", 8, "four", ("n6",), 4, "A100", 40))
    domain = _domains(MOVED, FLEET)
    memo = IndexMemo()
    priorities = {d.model: d.priority for d in MOVED}
    profiles = {(d.model, p.name): p for d in MOVED for p in d.profiles}
    eight = MOVED[-1].profiles[0]
    found = []
    for lost in ((), ("n6",)):
        after = [p for p in before if p.nodes[0] not in lost]
        capacity = Capacity(list(FLEET.values()), set(FLEET) - set(lost))
        for p in after:
            capacity.consume(p.nodes, p.gpus_per_node, p.memory_gb_per_node)
        index = memo.index_of(after, MOVED, "v", domain, {"a"})
        common: dict[str, Any] = {"priorities": priorities, "budget": {}, "profiles": profiles}
        common |= {"domain": domain, "required": {"a"}}
        found.append(moves_for("e", 1, eight, capacity, after, index=index, **common))
        afresh = _Index(after, domain, {"a"})
        assert found[-1] == moves_for("e", 1, eight, capacity, after, index=afresh, **common)
    assert found[0].node is not None
    assert index.reused > 0


def test_the_round_after_a_write_keeps_the_other_nodes_trials() -> None:
    """The round after a write reads back the placements it placed (new in the kept
    placements, not only some gone): the index is patched with them, not built again, and
    every node they do not touch keeps its trial (on the old tree: built again, no trial
    kept); moves are those of an index built afresh."""
    from scheduler.planner.defrag import moves_for
    from scheduler.planner.fleet.capacity import Capacity

    before = [
        Placement(model, i, name, (f"n{i}",), gpus, "A100", 10 * gpus)
        for i in range(8)
        for model, (gpus, name) in SIZES.items()
        if (model == "d") == (i == 6)
    ]
    domain = _domains(MOVED, FLEET)
    memo = IndexMemo()
    priorities = {d.model: d.priority for d in MOVED}
    profiles = {(d.model, p.name): p for d in MOVED for p in d.profiles}
    eight = MOVED[-1].profiles[0]
    common: dict[str, Any] = {"priorities": priorities, "budget": {}, "profiles": profiles}
    common |= {"domain": domain, "required": {"a"}}
    # A replica of d placed on n6 by the round before (its room taken there, but not
    # among the placements kept), read back after its write (kept now, the same room).
    written = Placement("d", 8, "four", ("n6",), 4, "A100", 40)
    for after in (before, [*before[:13], written, *before[13:]]):
        capacity = Capacity(list(FLEET.values()), set(FLEET))
        for p in (*before, written):
            capacity.consume(p.nodes, p.gpus_per_node, p.memory_gb_per_node)
        patched = memo.patched
        index = memo.index_of(after, MOVED, "v", domain, {"a"})
        got = moves_for("e", 1, eight, capacity, after, index=index, **common)
        afresh = _Index(after, domain, {"a"})
        assert got == moves_for("e", 1, eight, capacity, after, index=afresh, **common)
    assert memo.patched == patched + 1
    assert index.reused > 0


def test_a_trial_moving_a_model_whose_replicas_were_added_is_made_again() -> None:
    """A replica added by the write (the round after it) changes its model's spread
    counts: a trial that moved (or could not move) a replica of that model is made again,
    not taken from the round before. Here n1 can be cleared for e only by moving a's
    replica to n0, in the other zone, which a's required spread allows once a has a
    second replica in n1's zone (the one written)."""
    from scheduler.planner.defrag import moves_for
    from scheduler.planner.fleet.capacity import Capacity

    kept = [
        Placement("a", 0, "one", ("n1",), 1, "A100", 10),
        Placement("a", 1, "one", ("n0",), 1, "A100", 10),
    ]
    written = Placement("a", 2, "one", ("n7",), 1, "A100", 10)
    domain = _domains(MOVED, FLEET)
    memo = IndexMemo()
    priorities = {d.model: d.priority for d in MOVED}
    profiles = {(d.model, p.name): p for d in MOVED for p in d.profiles}
    eight = MOVED[-1].profiles[0]
    common: dict[str, Any] = {"priorities": priorities, "budget": {}, "profiles": profiles}
    common |= {"domain": domain, "required": {"a"}}
    found = []
    for after in (kept, [*kept, written]):
        capacity = Capacity(list(FLEET.values()), set(FLEET))
        for p in (*kept, written):
            capacity.consume(p.nodes, p.gpus_per_node, p.memory_gb_per_node)
        # Every other node full: n0 is the only destination.
        for name in ("n2", "n3", "n4", "n5", "n6", "n7"):
            capacity.consume(
                (name,), capacity.free_gpus(name), int(capacity.free_memory(name) or 0)
            )
        index = memo.index_of(after, MOVED, "v", domain, {"a"})
        found.append(moves_for("e", 1, eight, capacity, after, index=index, **common))
        afresh = _Index(after, domain, {"a"})
        assert found[-1] == moves_for("e", 1, eight, capacity, after, index=afresh, **common)
    assert found[0].node is None and found[1].node == "n1"


def _moves_for_e(
    memo: IndexMemo,
    after: list[Placement],
    capacity: Any,
    *,
    budget: dict[str, int] | None = None,
    movable: dict[str, bool] | None = None,
) -> tuple[Any, Any, _Index]:
    """``moves_for`` e's whole node on an index patched by ``memo`` and on one afresh."""
    from scheduler.planner.defrag import moves_for

    domain = _domains(MOVED, FLEET)
    common: dict[str, Any] = {
        "priorities": {d.model: d.priority for d in MOVED},
        "budget": budget or {},
        "profiles": {(d.model, p.name): p for d in MOVED for p in d.profiles},
        "movable": movable or {},
        "domain": domain,
        "required": {"a"},
    }
    eight = MOVED[-1].profiles[0]
    index = memo.index_of(after, MOVED, "v", domain, {"a"})
    got = moves_for("e", 1, eight, capacity, after, index=index, **common)
    afresh = moves_for("e", 1, eight, capacity, after, index=_Index(after, domain, {"a"}), **common)
    return got, afresh, index


# The very same object every round (a new one would be a placement gone and one added).
B_ON_N3 = Placement("b", 0, "two", ("n3",), 2, "A100", 20)


def _one_b_on_n3(*, b_placed: bool = True, n3_taken: bool = False) -> tuple[list[Placement], Any]:
    """Every node full but n0 (2 cards free) and n3 (b's replica of 2 cards, the rest
    free): e's whole node is made on n3 by moving b's replica to n0, and nowhere else."""
    from scheduler.planner.fleet.capacity import Capacity

    kept = [B_ON_N3] if b_placed else []
    capacity = Capacity(list(FLEET.values()), set(FLEET))
    capacity.consume(("n3",), 2, 20)  # b's replica (or, not kept, another in its room)
    capacity.consume(("n0",), 6, 60)
    for name in ("n1", "n2", "n4", "n5", "n6", "n7"):
        capacity.consume((name,), 8, 80)
    if n3_taken:
        capacity.consume(("n3",), 1, 10)
    return kept, capacity


def test_a_search_is_patched_where_its_inputs_changed_not_made_again() -> None:
    """A round whose index is patched takes the round before's search of a shape and
    searches again only the nodes whose inputs changed (here n3, whose room moved), not
    every eligible node (on the old tree every node was searched again each round)."""
    memo = IndexMemo()
    kept, capacity = _one_b_on_n3()
    got, afresh, index = _moves_for_e(memo, kept, capacity)
    assert got == afresh and got.node == "n3"
    kept, capacity = _one_b_on_n3(n3_taken=True)
    got, afresh, index = _moves_for_e(memo, kept, capacity)
    assert got == afresh and got.node is None
    assert (index.searches_patched, index.searched_again) == (1, 1)


def test_a_node_whose_placements_changed_in_the_same_room_is_searched_again() -> None:
    """b's replica gone from n3 while another takes its room (placed this round, not among
    the kept): n3's room is the same, but its candidates are not; its part of the search
    is made again (kept, it would move a replica no longer there)."""
    memo = IndexMemo()
    kept, capacity = _one_b_on_n3()
    got, afresh, _ = _moves_for_e(memo, kept, capacity)
    assert got == afresh and got.node == "n3"
    kept, capacity = _one_b_on_n3(b_placed=False)
    got, afresh, index = _moves_for_e(memo, kept, capacity)
    assert got == afresh and got.node is None
    assert index.searches_patched == 1


def test_a_node_whose_replicas_turned_unmovable_is_searched_again() -> None:
    """b turned unmovable between rounds (a rollout began): n3, where b runs, is searched
    again and can no longer be cleared, and b is named as what stood in the way."""
    memo = IndexMemo()
    kept, capacity = _one_b_on_n3()
    got, afresh, _ = _moves_for_e(memo, kept, capacity)
    assert got == afresh and got.node == "n3"
    kept, capacity = _one_b_on_n3()
    got, afresh, index = _moves_for_e(memo, kept, capacity, movable={"b": False})
    assert got == afresh and got.node is None and got.blocked == ("b",)
    assert index.searches_patched == 1


def test_a_node_whose_replicas_budget_moved_is_searched_again() -> None:
    """b's disruption budget down to 0 between rounds: n3 is searched again."""
    memo = IndexMemo()
    kept, capacity = _one_b_on_n3()
    got, afresh, _ = _moves_for_e(memo, kept, capacity, budget={"b": 1})
    assert got == afresh and got.node == "n3"
    kept, capacity = _one_b_on_n3()
    got, afresh, index = _moves_for_e(memo, kept, capacity, budget={"b": 0})
    assert got == afresh and got.node is None and got.blocked == ("b",)
    assert index.searches_patched == 1


def test_a_node_whose_moves_destination_filled_is_searched_again() -> None:
    """n0, where n3's trial would move b's replica, filled between rounds: n3's room and
    placements are the same, but the destinations its trial looked at are not."""
    memo = IndexMemo()
    kept, capacity = _one_b_on_n3()
    got, afresh, _ = _moves_for_e(memo, kept, capacity)
    assert got == afresh and got.node == "n3"
    kept, capacity = _one_b_on_n3()
    capacity.consume(("n0",), 2, 20)
    got, afresh, index = _moves_for_e(memo, kept, capacity)
    assert got == afresh and got.node is None
    assert index.searches_patched == 1
