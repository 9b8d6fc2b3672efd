"""Placement policy: spread, preemption by priority, the order models claim hardware,
resilience, and a quality never below first fit or plain best fit."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.placement import firstfit
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement
from scheduler.planner.resilience import min_hitting_set, resilience
from tests.unit.scheduler.placement_builders import (
    NOW,
    demand,
    hosts,
    node,
    overcommitted,
    profile,
    run,
)
from tests.unit.scheduler.test_placement_properties import INVENTORIES, UNNAMED_PROFILES

moderate = settings(max_examples=60, deadline=None)


def zoned(name: str, zone: str, gpus: int = 8, **extra: object) -> Node:
    return node(name, "A100", gpus, labels={"zone": zone}, **extra)  # type: ignore[arg-type]


def policy_demand(model: str, replicas: int, *profiles: object, **rules: object) -> Demand:
    return replace(demand(model, replicas, *profiles), **rules)  # type: ignore[arg-type]


# -- spread --------------------------------------------------------------------------


def test_replicas_of_a_model_go_on_distinct_nodes_while_one_without_them_fits() -> None:
    result = run([demand("embed", 2, profile("l4", gpus=1))], [node("a"), node("b")])

    assert sorted(hosts(result, "embed")) == [("a",), ("b",)]


def test_replicas_share_a_node_only_when_no_other_fits() -> None:
    result = run([demand("embed", 3, profile("l4", gpus=1))], [node("a"), node("b")])

    assert sorted(h[0] for h in hosts(result, "embed")) == ["a", "a", "b"]


def test_spread_by_a_label_balances_its_values() -> None:
    nodes = [zoned("eu-1", "eu"), zoned("eu-2", "eu"), zoned("eu-3", "eu"), zoned("us-1", "us")]

    result = run([policy_demand("m", 4, profile(gpus=2), spread_by="zone")], nodes)

    zones = sorted(n.split("-")[0] for (n,) in hosts(result, "m"))
    assert zones == ["eu", "eu", "us", "us"]
    assert result.resilience[0].domains == 2


def test_a_required_spread_leaves_a_replica_unplaced_rather_than_break_it() -> None:
    nodes = [zoned("eu-1", "eu"), zoned("eu-2", "eu"), zoned("us-1", "us", gpus=2)]
    m = policy_demand("m", 4, profile(gpus=2), spread_by="zone", spread_required=True)

    result = run([m], nodes)

    # eu, us, eu; the fourth would make it 3 to 1, and us has no room left.
    zones = sorted(n.split("-")[0] for (n,) in hosts(result, "m"))
    assert zones == ["eu", "eu", "us"]
    assert [u.replica for u in result.unplaced] == [3]
    assert result.unplaced[0].reason.startswith("spread_required: the next replica must go to")
    assert "zone=us" in result.unplaced[0].reason


def test_spread_is_not_a_reason_to_move_a_running_replica() -> None:
    running = [
        Placement("m", 0, "a100x8", ("a",), 1, "A100"),
        Placement("m", 1, "a100x8", ("a",), 1, "A100"),
    ]

    result = run([demand("m", 2, profile(gpus=1))], [node("a"), node("b")], running)

    assert not result.changes_anything


# -- order ---------------------------------------------------------------------------


def test_a_large_gang_late_in_the_catalog_is_not_starved_by_small_models() -> None:
    nodes = [node(f"n{i}", fabric="ib") for i in range(4)]
    small = demand("small", 4, profile("one", gpus=1))
    gang = demand("gang", 1, profile("2x8", gpus=8, nodes=2))

    result = run([small, gang], nodes)

    assert result.unplaced == ()
    assert len(hosts(result, "gang")[0]) == 2


def test_a_higher_priority_model_claims_hardware_first_whatever_the_catalog_order() -> None:
    trial = demand("trial", 1, profile(gpus=8))
    prod = policy_demand("prod", 1, profile(gpus=8), priority=10)

    result = run([trial, prod], [node("only")], policy=StalenessPolicy(preemption=False))

    assert hosts(result, "prod") == [("only",)]
    assert [u.model for u in result.unplaced] == ["trial"]


# -- preemption ----------------------------------------------------------------------

TRIAL = Placement("trial", 0, "a100x8", ("only",), 8, "A100")


def test_a_higher_priority_replica_evicts_a_lower_one_that_holds_its_room() -> None:
    prod = policy_demand("prod", 1, profile(gpus=8), priority=10)

    result = run([demand("trial", 1, profile(gpus=8)), prod], [node("only")], [TRIAL])

    assert [(r.placement.model, r.reason) for r in result.remove] == [
        ("trial", "preempted by prod[0]")
    ]
    assert hosts(result, "prod") == [("only",)]
    assert [(u.model, u.replica) for u in result.unplaced] == [("trial", 0)]
    assert result.unplaced[0].reason.startswith("preempted by prod[0]; ")


def test_equal_priority_never_preempts() -> None:
    result = run([demand("trial", 1, profile(gpus=8)), demand("b", 1)], [node("only")], [TRIAL])

    assert result.remove == ()
    assert [u.model for u in result.unplaced] == ["b"]


def test_the_policy_switch_turns_preemption_off() -> None:
    prod = policy_demand("prod", 1, profile(gpus=8), priority=10)
    off = StalenessPolicy(preemption=False)

    result = run([demand("trial", 1, profile(gpus=8)), prod], [node("only")], [TRIAL], policy=off)

    assert result.remove == ()


def test_an_evicted_replica_is_placed_again_elsewhere_when_it_fits() -> None:
    prod = policy_demand("prod", 1, profile(gpus=8, selector={"zone": "eu"}), priority=10)
    nodes = [zoned("eu-1", "eu"), zoned("us-1", "us")]
    trial = Placement("trial", 0, "a100x8", ("eu-1",), 8, "A100")

    result = run([demand("trial", 1, profile(gpus=8)), prod], nodes, [trial])

    assert [r.reason for r in result.remove] == ["preempted by prod[0]"]
    assert hosts(result, "trial") == [("us-1",)]
    assert result.unplaced == ()


def test_a_gang_evicts_on_all_its_nodes_or_on_none() -> None:
    # Two nodes share the fabric; the high-priority model's replica on one of
    # them cannot be evicted, so the gang can have only one node: nothing goes.
    nodes = [node("a", fabric="ib"), node("b", fabric="ib")]
    running = [
        Placement("low", 0, "a100x8", ("a",), 8, "A100"),
        Placement("high", 0, "a100x8", ("b",), 8, "A100"),
    ]
    demands = [
        policy_demand("high", 1, profile(gpus=8), priority=20),
        policy_demand("gang", 1, profile("2x8", gpus=8, nodes=2), priority=10),
        demand("low", 1, profile(gpus=8)),
    ]

    result = run(demands, nodes, running)

    assert result.remove == ()
    assert [u.model for u in result.unplaced] == ["gang"]


# -- resilience ----------------------------------------------------------------------


def test_resilience_is_the_fewest_nodes_whose_loss_leaves_no_replica() -> None:
    assert min_hitting_set([]) == 0
    assert min_hitting_set([frozenset("a"), frozenset("a")]) == 1
    assert min_hitting_set([frozenset("a"), frozenset("b")]) == 2
    # Gangs {a,b} and {b,c}: losing b takes both.
    assert min_hitting_set([frozenset("ab"), frozenset("bc")]) == 1
    assert min_hitting_set([frozenset("ab"), frozenset("cd"), frozenset("bc")]) == 2


def test_resilience_counts_nodes_and_label_values() -> None:
    nodes = {n.name: n for n in [zoned("eu-1", "eu"), zoned("eu-2", "eu")]}
    placements = [
        Placement("m", 0, "p", ("eu-1",), 1, "A100"),
        Placement("m", 1, "p", ("eu-2",), 1, "A100"),
    ]
    demands = [replace(demand("m", 2), spread_by="zone"), demand("idle", 1)]

    figures = resilience(demands, placements, nodes)

    assert [(r.model, r.replicas, r.nodes, r.domains) for r in figures] == [
        ("m", 2, 2, 1),
        ("idle", 0, 0, None),
    ]
    assert figures[0].describe() == "lost with 2 nodes, 1 zone value (2 replicas)"


# -- properties ----------------------------------------------------------------------

SPREADS = st.sampled_from([(None, False), ("zone", False), ("zone", True), (None, True)])


@st.composite
def _policy_catalogs(draw: st.DrawFn) -> list[Demand]:
    demands = []
    for model in draw(st.lists(st.sampled_from(["m0", "m1", "m2", "m3"]), unique=True)):
        profiles = tuple(
            replace(draw(UNNAMED_PROFILES), name=f"p{i}") for i in range(draw(st.integers(1, 2)))
        )
        spread_by, required = draw(SPREADS)
        demands.append(
            Demand(
                model,
                draw(st.integers(0, 4)),
                profiles,
                priority=draw(st.integers(0, 2)),
                spread_by=spread_by,
                spread_required=required,
            )
        )
    return demands


POLICY_CATALOGS = _policy_catalogs()


@moderate
@given(POLICY_CATALOGS, POLICY_CATALOGS, INVENTORIES)
def test_spread_and_preemption_never_overcommit_a_node(
    before: list[Demand], demands: list[Demand], nodes: list[Node]
) -> None:
    current = run(before, nodes).placements

    result = run(demands, nodes, current)

    assert overcommitted(result.placements, nodes) == []


@moderate
@given(POLICY_CATALOGS, POLICY_CATALOGS, INVENTORIES)
def test_preemption_never_evicts_equal_or_higher_priority_and_places_its_preemptor(
    before: list[Demand], demands: list[Demand], nodes: list[Node]
) -> None:
    current = run(before, nodes).placements
    priority = {d.model: d.priority for d in demands}

    result = run(demands, nodes, current)

    placed = {f"{p.model}[{p.replica}]" for p in result.placements}
    for removal in result.remove:
        if removal.reason.startswith("preempted by "):
            preemptor = removal.reason.removeprefix("preempted by ")
            assert priority[removal.placement.model] < priority[preemptor.split("[")[0]]
            assert preemptor in placed


@moderate
@given(
    st.lists(
        st.builds(lambda p, n: Demand("", n, (p,)), UNNAMED_PROFILES, st.integers(1, 4)),
        max_size=4,
    ),
    INVENTORIES,
)
def test_a_round_places_at_least_the_gpus_of_first_fit_and_plain_best_fit(
    unnamed: list[Demand], nodes: list[Node]
) -> None:
    demands = [replace(d, model=f"m{i}") for i, d in enumerate(unnamed)]

    result = run(demands, nodes)

    def gpus(placements: list[Placement] | tuple[Placement, ...]) -> int:
        return sum(p.gpus_per_node * len(p.nodes) for p in placements)

    assert gpus(result.placements) >= gpus(firstfit.place(demands, nodes, NOW))
    assert gpus(result.placements) >= gpus(firstfit.best_fit(demands, nodes, NOW))


@moderate
@given(POLICY_CATALOGS, POLICY_CATALOGS, INVENTORIES)
def test_the_plan_is_the_same_whatever_order_nodes_and_placements_arrive_in(
    before: list[Demand], demands: list[Demand], nodes: list[Node]
) -> None:
    current = list(run(before, nodes).placements)
    shuffled_nodes, shuffled_current = list(nodes), list(current)
    random.Random(3).shuffle(shuffled_nodes)
    random.Random(4).shuffle(shuffled_current)

    assert run(demands, shuffled_nodes, shuffled_current) == run(demands, nodes, current)


@moderate
@given(POLICY_CATALOGS, INVENTORIES)
def test_a_second_round_with_nothing_changed_changes_nothing(
    demands: list[Demand], nodes: list[Node]
) -> None:
    first = run(demands, nodes)

    assert not run(demands, nodes, first.placements).changes_anything
