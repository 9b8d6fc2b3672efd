"""The node-type ceiling (scheduler.exact.bound) and the per-node swaps (scheduler.exact.fill),
held to a brute-force optimum on rounds small enough to enumerate."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.exact.bound import gpu_bound, most_cards
from scheduler.exact.fill import fill_idle, problems
from scheduler.exact.score import score
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement
from tests.unit.scheduler.placement_builders import NOW, demand, node, profile, run

# The tests that solve with OR-Tools share one xdist worker: only that worker imports it
# (~0.5 s of CPU; scheduler.exact loads it when a program is built, not at collection).
pytestmark = pytest.mark.xdist_group("ortools")


def brute_force(demands: Sequence[Demand], nodes: Sequence[Node]) -> int:
    """The most GPUs any round places, by trying every replica everywhere (tiny rounds only).

    Written from the rules, not from the code under test: a replica goes nowhere or on one
    of its profiles, on nodes of its class and labels with the cards and memory it asks
    (a k-node gang on k distinct nodes of one fabric), within each node's usable cards
    and reported memory.
    """
    options: list[list[tuple[int, int, tuple[str, ...]]]] = []
    for d in demands:
        choices: list[tuple[int, int, tuple[str, ...]]] = [(0, 0, ())]
        for p in d.profiles:
            fit = [
                n
                for n in nodes
                if n.gpu_class == p.gpu_class
                and all(n.labels.get(k) == v for k, v in p.node_selector.items())
            ]
            k = max(p.nodes, 1)
            for combo in itertools.combinations(fit, k):
                if k > 1 and (combo[0].fabric is None or len({n.fabric for n in combo}) > 1):
                    continue
                choices.append((p.gpus_per_node, p.min_memory_gb, tuple(n.name for n in combo)))
        options += [choices] * d.replicas
    cards = {n.name: n.gpus - n.gpus_reserved for n in nodes}
    memory = {n.name: n.memory_gb for n in nodes}
    best = 0

    def place(i: int, used: dict[str, tuple[int, int]], gpus: int) -> None:
        nonlocal best
        best = max(best, gpus)
        if i == len(options):
            return
        for g, m, names in options[i]:
            after = dict(used)
            ok = True
            for name in names:
                c, mem = after.get(name, (0, 0))
                room = memory[name]
                if c + g > cards[name] or (room is not None and mem + m > room):
                    ok = False
                    break
                after[name] = (c + g, mem + m)
            if ok:
                place(i + 1, after, gpus + g * len(names))

    place(0, {}, 0)
    return best


def test_the_per_node_ceiling_counts_cards_and_memory_together() -> None:
    # 7 usable cards and only even profiles: 6. 128 GB at 46 GB a card: 2 cards of 4.
    assert most_cards(7, None, [(2, 0), (4, 0), (8, 0)]) == 6
    assert most_cards(4, 128, [(1, 46)]) == 2
    # A cheaper shape fills what the dear one leaves: 1x6 GB next to 3x46 GB in 144 GB.
    assert most_cards(4, 144, [(1, 46), (1, 6)]) == 4
    assert most_cards(4, 10, [(1, 46)]) == 0


def test_the_bound_sees_cards_no_profile_can_use() -> None:
    # Each node has 7 usable cards and every profile asks for 2: one card each stays idle.
    nodes = [node(f"n{i}", "A100", 8, reserved=1) for i in range(3)]
    demands = [demand("m", 20, profile("a2", "A100", 2))]
    bound = gpu_bound(demands, nodes, NOW)
    assert (bound.cards, bound.gpus) == (21, 18)
    assert brute_force([demand("m", 20, profile("a2", "A100", 2))], nodes[:1]) == 6


def test_the_bound_counts_memory_per_node() -> None:
    # Two nodes of 4 cards and 128 GB; four 46 GB replicas and one of 6 GB: 2 + 2 + 1 = 5.
    nodes = [node(f"n{i}", "V100", 4, memory_gb=128.0) for i in range(2)]
    demands = [
        demand("big", 4, profile("v46", "V100", 1, memory_gb=46)),
        demand("small", 1, profile("v6", "V100", 1, memory_gb=6)),
    ]
    assert gpu_bound(demands, nodes, NOW).gpus == 5 == brute_force(demands, nodes)


def test_a_swap_uses_the_card_memory_left_idle() -> None:
    # The openb pods case: a node with one card free and 2 GB; two 6 GB replicas wait.
    nodes = [node("n0", "V100", 4, memory_gb=128.0)]
    demands = [
        demand("a", 1, profile("v", "V100", 1, memory_gb=6)),
        demand("b", 1, profile("v", "V100", 1, memory_gb=46)),
        demand("c", 1, profile("v", "V100", 1, memory_gb=76)),
        demand("d", 2, profile("v", "V100", 1, memory_gb=6)),
    ]
    placed = [
        Placement(m, 0, "v", ("n0",), 1, "V100", gb) for m, gb in (("a", 6), ("b", 46), ("c", 76))
    ]
    filled = fill_idle(demands, nodes, placed, NOW)
    assert problems(demands, nodes, filled.placements, NOW) == []
    assert score(demands, filled.placements).gpus == 4 == brute_force(demands, nodes)
    [swap] = filled.swaps
    assert [p.model for p in swap.out] == ["b"] and swap.gained == 1
    assert sorted((p.model, p.replica) for p in swap.into) == [("d", 0), ("d", 1)]


def test_problems_finds_what_is_wrong() -> None:
    nodes = [node("n0", "V100", 2, memory_gb=10.0), node("n1", "T4", 2)]
    demands = [demand("m", 2, profile("v", "V100", 1, memory_gb=6))]
    wrong = [
        Placement("m", 0, "v", ("n0",), 1, "V100", 6),
        Placement("m", 1, "v", ("n0",), 1, "V100", 6),  # 12 GB of 10
        Placement("m", 1, "v", ("n1",), 1, "V100", 6),  # twice, and on a T4 node
        Placement("m", 2, "v", ("n0",), 1, "V100", 6),  # beyond 2 replicas
    ]
    found = problems(demands, nodes, wrong, NOW)
    assert any("placed twice" in p for p in found)
    assert any("n1 is T4" in p for p in found)
    assert any("beyond the 2" in p for p in found)
    assert any("GB used of 10" in p for p in found)


_NODES = st.lists(
    st.tuples(
        st.sampled_from(["A100", "T4"]),
        st.integers(1, 4),
        st.integers(0, 1),
        st.sampled_from([None, 16.0, 40.0]),
        st.sampled_from(["eu", "us"]),
        st.sampled_from([None, "f1"]),
    ),
    min_size=1,
    max_size=3,
)
_PROFILES = st.tuples(
    st.sampled_from(["A100", "T4"]),
    st.integers(1, 3),
    st.sampled_from([1, 1, 2]),
    st.sampled_from([0, 6, 15]),
    st.booleans(),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=_NODES,
    wanted=st.lists(
        st.tuples(st.integers(1, 2), st.lists(_PROFILES, min_size=1, max_size=2)),
        min_size=1,
        max_size=3,
    ),
)
def test_the_bound_is_never_below_the_optimum_and_the_swaps_never_beyond_it(
    shapes: list[tuple[str, int, int, float | None, str, str | None]],
    wanted: list[tuple[int, list[tuple[str, int, int, int, bool]]]],
) -> None:
    nodes = [
        node(f"n{i}", cls, cards, memory_gb=mem, labels={"zone": zone}, fabric=fab, reserved=res)
        for i, (cls, cards, res, mem, zone, fab) in enumerate(shapes)
    ]
    demands = [
        demand(
            f"m{i}",
            count,
            *(
                profile(
                    f"p{j}", cls, g, nodes=k, memory_gb=m, selector={"zone": "eu"} if eu else None
                )
                for j, (cls, g, k, m, eu) in enumerate(profs)
            ),
        )
        for i, (count, profs) in enumerate(wanted)
    ]
    optimum = brute_force(demands, nodes)
    bound = gpu_bound(demands, nodes, NOW)
    assert bound.status == "optimal"
    assert optimum <= bound.gpus <= bound.cards
    planned = run(demands, nodes).placements
    filled = fill_idle(demands, nodes, planned, NOW)
    assert problems(demands, nodes, filled.placements, NOW) == []
    assert score(demands, planned).gpus <= score(demands, filled.placements).gpus <= optimum
