"""Which nodes a profile fits, which of them it gets, and which profile wins."""

from __future__ import annotations

from datetime import timedelta

from tests.unit.scheduler.placement_builders import (
    cpu_node,
    cpu_profile,
    demand,
    hosts,
    node,
    profile,
    run,
)


def test_a_replica_lands_on_a_node_of_its_gpu_class() -> None:
    result = run([demand("m", 1, profile(gpu_class="A100"))], [node("t4", "T4"), node("a")])

    assert hosts(result, "m") == [("a",)]


def test_a_node_of_another_gpu_class_is_not_used() -> None:
    result = run([demand("m", 1, profile(gpu_class="A100"))], [node("t4", "T4")])

    assert result.place == ()
    assert "gpu_class is T4 not A100" in result.unplaced[0].reason


def test_a_node_without_enough_free_gpus_is_not_used() -> None:
    result = run([demand("m", 1, profile(gpus=8))], [node("small", gpus=4), node("big", gpus=8)])

    assert hosts(result, "m") == [("big",)]


def test_cards_reserved_outside_the_control_plane_are_not_free() -> None:
    result = run([demand("m", 1, profile(gpus=4))], [node("busy", gpus=8, reserved=5)])

    assert result.place == ()
    assert "1 has fewer than 4 free GPUs" in result.unplaced[0].reason


def test_gpus_taken_by_earlier_replicas_are_not_free() -> None:
    result = run([demand("m", 3, profile(gpus=4))], [node("a", gpus=8)])

    assert hosts(result, "m") == [("a",), ("a",)]
    assert [u.replica for u in result.unplaced] == [2]


def test_a_node_without_the_selector_label_is_not_used() -> None:
    eu_only = profile(selector={"zone": "eu"})
    nodes = [node("plain"), node("us", labels={"zone": "us"}), node("eu", labels={"zone": "eu"})]

    result = run([demand("m", 2, eu_only)], nodes)

    assert hosts(result, "m") == [("eu",)]
    assert "2 lack label zone=eu" in result.unplaced[0].reason


def test_memory_taken_by_other_replicas_is_not_free() -> None:
    needs_64 = cpu_profile(memory_gb=64)

    result = run([demand("m", 2, needs_64)], [cpu_node("a", memory_gb=100)])

    assert hosts(result, "m") == [("a",)]
    assert "1 has less than 64 GB free memory" in result.unplaced[0].reason


def test_a_node_with_unknown_memory_fits_any_memory_need() -> None:
    result = run([demand("m", 2, cpu_profile(memory_gb=512))], [cpu_node("old-agent")])

    assert hosts(result, "m") == [("old-agent",), ("old-agent",)]


def test_a_stale_node_gets_no_new_replica() -> None:
    nodes = [node("quiet", silent_for=timedelta(minutes=2)), node("chatty")]

    result = run([demand("m", 2, profile(gpus=4))], nodes)

    assert hosts(result, "m") == [("chatty",), ("chatty",)]


def test_a_cpu_profile_can_run_on_a_gpu_node_without_using_its_cards() -> None:
    full = node("full", gpus=8)
    result = run([demand("gpu", 1, profile(gpus=8)), demand("cpu", 1, cpu_profile())], [full])

    assert hosts(result, "gpu") == [("full",)]
    assert hosts(result, "cpu") == [("full",)]
    assert result.placements[0].gpus_per_node == 0


def test_a_cpu_profile_prefers_a_node_whose_cards_are_not_free() -> None:
    nodes = [node("idle-gpus"), cpu_node("cpu")]

    result = run([demand("m", 1, cpu_profile())], nodes)

    assert hosts(result, "m") == [("cpu",)]


def test_best_fit_takes_the_node_with_the_fewest_free_gpus_that_still_fits() -> None:
    nodes = [node("eight", gpus=8), node("four", gpus=4), node("two", gpus=2)]

    result = run([demand("m", 1, profile(gpus=4))], nodes)

    assert hosts(result, "m") == [("four",)]


def test_large_replicas_claim_whole_nodes_before_small_ones_scatter() -> None:
    # Small replicas first, spread over both nodes, would leave no node with
    # 8 free cards for the large one; larger replicas are placed first.
    small = demand("small", 2, profile("half", gpus=4))
    large = demand("large", 1, profile("whole", gpus=8))

    result = run([small, large], [node("a"), node("b")])

    assert result.unplaced == ()
    assert hosts(result, "large") == [("a",)]
    assert hosts(result, "small") == [("b",), ("b",)]


def test_among_equal_gpus_best_fit_takes_the_least_free_memory() -> None:
    nodes = [node("roomy", memory_gb=512), node("snug", memory_gb=128), node("unknown")]

    result = run([demand("m", 1, profile(memory_gb=100))], nodes)

    assert hosts(result, "m") == [("snug",)]


def test_ties_are_broken_by_node_name() -> None:
    result = run([demand("m", 1)], [node("c"), node("a"), node("b")])

    assert hosts(result, "m") == [("a",)]


def test_the_highest_priority_profile_that_fits_wins() -> None:
    fast = profile("fast", "A100", 8, priority=10)
    cheap = profile("cheap", "T4", 2, priority=1)

    result = run([demand("m", 1, cheap, fast)], [node("a"), node("t", "T4", 4)])

    assert [p.profile for p in result.placements] == ["fast"]


def test_a_lower_priority_profile_is_used_when_the_higher_does_not_fit() -> None:
    fast = profile("fast", "A100", 8, priority=10)
    cheap = profile("cheap", "T4", 2, priority=1)

    result = run([demand("m", 3, fast, cheap)], [node("a"), node("t", "T4", 4)])

    assert [(p.profile, p.nodes) for p in result.placements] == [
        ("fast", ("a",)),
        ("cheap", ("t",)),
        ("cheap", ("t",)),
    ]


def test_profiles_of_equal_priority_are_tried_in_declaration_order() -> None:
    first = profile("first", "T4", 2)
    second = profile("second", "A100", 8)

    result = run([demand("m", 1, first, second)], [node("a"), node("t", "T4", 2)])

    assert [p.profile for p in result.placements] == ["first"]


def test_earlier_models_claim_scarce_hardware_first() -> None:
    result = run([demand("first", 1), demand("second", 1)], [node("only")])

    assert hosts(result, "first") == [("only",)]
    assert [u.model for u in result.unplaced] == ["second"]


def test_a_model_wanting_no_replicas_gets_none() -> None:
    result = run([demand("m", 0)], [node("a")])

    assert result.placements == ()
    assert result.unplaced == ()


def test_a_placement_records_what_it_consumes() -> None:
    result = run([demand("m", 1, profile("p", "T4", 2, memory_gb=16))], [node("t", "T4", 4)])

    (placement,) = result.place
    assert placement.model == "m"
    assert placement.replica == 0
    assert placement.profile == "p"
    assert placement.nodes == ("t",)
    assert placement.gpus_per_node == 2
    assert placement.gpu_class == "T4"
    assert placement.memory_gb_per_node == 16
