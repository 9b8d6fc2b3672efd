"""The exact reference (scheduler.exact): deterministic, feasible, and truly optimal on small
rounds whose optimum is known by hand; and the planner measured against it."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.exact.program import solve
from scheduler.exact.score import score
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement
from tests.unit.scheduler.placement_builders import (
    NOW,
    demand,
    node,
    overcommitted,
    profile,
    run,
)

# The tests that solve with OR-Tools share one xdist worker: only that worker imports it
# (~0.5 s of CPU; scheduler.exact loads it when a program is built, not at collection).
pytestmark = pytest.mark.xdist_group("ortools")


def fragmented() -> tuple[list[Demand], list[Node], list[Placement]]:
    """8 nodes x 8 T4 cards, 56 one-card replicas 7 per node, and a TP=8 model waiting."""
    nodes = [node(f"n{i}", "T4", 8) for i in range(8)]
    small = demand("small", 56, profile("t4", "T4", 1))
    big = demand("big", 1, profile("t4x8", "T4", 8))
    current = [Placement("small", r, "t4", (f"n{r % 8}",), 1, "T4") for r in range(56)]
    return [small, big], nodes, current


def test_the_fragmented_cluster_needs_seven_moves_and_cp_sat_proves_it() -> None:
    demands, nodes, current = fragmented()
    answer = solve(demands, nodes, current, NOW, work=20)
    assert answer.status == "optimal"
    assert answer.score is not None
    # Everything placed (57 replicas), by moving the 7 replicas off one node: no fewer.
    assert answer.score.replicas == 57
    assert answer.score.moves == 7
    assert overcommitted(answer.placements, nodes) == []
    # The planner alone places 56 of 57: what defragmentation is for.
    heuristic = score(demands, run(demands, nodes, current).placements, current)
    assert heuristic.replicas == 56


def test_same_inputs_same_answer() -> None:
    demands, nodes, current = fragmented()
    first = solve(demands, nodes, current, NOW, work=5)
    again = solve(list(demands), list(reversed(nodes)), list(reversed(current)), NOW, work=5)
    assert (first.status, first.objective, first.placements) == (
        again.status,
        again.objective,
        again.placements,
    )


def test_priority_outranks_any_number_of_lower_replicas() -> None:
    nodes = [node("n0", "A100", 8)]
    low = demand("low", 8, profile("a1", "A100", 1))
    high = demand("high", 1, profile("a8", "A100", 8))
    high = type(high)(high.model, high.replicas, high.profiles, priority=10)
    answer = solve([low, high], nodes, (), NOW)
    assert answer.score is not None
    assert answer.score.tiers == ((10, 1), (0, 0))


def test_gangs_take_distinct_nodes_of_one_fabric() -> None:
    nodes = [node(f"n{i}", "H100", 8, fabric="f1" if i < 3 else "f2") for i in range(5)]
    gang = demand("gang", 3, profile("h2x8", "H100", 8, nodes=2))
    answer = solve([gang], nodes, (), NOW)
    assert answer.status == "optimal"
    # f1 holds one gang (3 nodes, 2 each), f2 one: two of three.
    assert answer.score is not None and answer.score.replicas == 2
    for p in answer.placements:
        assert len(set(p.nodes)) == 2
        assert len({n[1] < "3" for n in p.nodes}) == 1  # one fabric
    assert overcommitted(answer.placements, nodes) == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cards=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=5),
    memory=st.lists(st.sampled_from([None, 16.0, 64.0]), min_size=5, max_size=5),
    sizes=st.lists(
        st.tuples(st.integers(1, 6), st.sampled_from([1, 2, 4, 8]), st.sampled_from([0, 8, 32])),
        min_size=1,
        max_size=4,
    ),
)
def test_cp_sat_is_never_worse_than_the_planner_and_never_overcommits(
    cards: list[int], memory: list[float | None], sizes: list[tuple[int, int, int]]
) -> None:
    nodes = [node(f"n{i}", "A100", c, memory_gb=memory[i]) for i, c in enumerate(cards)]
    demands = [
        demand(f"m{i}", r, profile(f"p{g}", "A100", g, memory_gb=m))
        for i, (r, g, m) in enumerate(sizes)
    ]
    result = run(demands, nodes)
    ours = score(demands, result.placements)
    answer = solve(demands, nodes, (), NOW, spread=False, work=5, hint=result.placements)
    assert answer.score is not None
    assert overcommitted(answer.placements, nodes) == []
    # Compared in the planner's own order: GPUs, then replicas (scheduler.exact.score).
    assert answer.score.key()[:2] >= ours.key()[:2]
    if answer.status == "optimal":
        assert answer.gpus_bound == answer.score.gpus
