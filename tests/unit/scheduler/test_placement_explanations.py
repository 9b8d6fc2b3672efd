"""An unplaced replica says, per profile tried, how many nodes refused it and why."""

from __future__ import annotations

from datetime import timedelta

from scheduler.planner.fleet.rejections import ProfileRejections, render_profile
from tests.unit.scheduler.placement_builders import (
    cpu_node,
    cpu_profile,
    demand,
    node,
    profile,
    run,
)


def test_an_unplaced_replica_explains_every_profile_tried_in_order() -> None:
    a100 = profile("a100-tp8", "A100", 8, priority=10, selector={"zone": "eu"})
    t4 = profile("t4-tp4", "T4", 4, priority=5)
    nodes = (
        [node(f"a10-{i}", "A10", 4) for i in range(3)]
        + [node(f"t4-{i}", "T4", 2) for i in range(2)]
        + [node("a100-busy", "A100", 8, reserved=4, labels={"zone": "eu"})]
        + [node("a100-us", "A100", 8, labels={"zone": "us"})]
        + [node("a100-silent", "A100", 8, silent_for=timedelta(minutes=3))]
        + [cpu_node("cpu")]
    )

    result = run([demand("llama-70b", 1, t4, a100)], nodes)

    (unplaced,) = result.unplaced
    assert unplaced.model == "llama-70b"
    assert unplaced.replica == 0
    assert unplaced.reason == (
        "profile a100-tp8: 0/9 nodes fit: 1 is stale, "
        "6 gpu_class is not A100 (3 A10, 2 T4, 1 without GPUs), "
        "1 lacks label zone=eu, 1 has fewer than 8 free GPUs; "
        "profile t4-tp4: 0/9 nodes fit: 1 is stale, "
        "6 gpu_class is not T4 (3 A10, 2 A100, 1 without GPUs), "
        "2 have fewer than 4 free GPUs"
    )


def test_a_node_whose_labels_do_not_match_is_named_for_them_even_when_it_is_full() -> None:
    """Issue 24: full nodes of the wrong zone were reported as "no free GPU", which sent the
    operator after capacity; labels are what a node *is*, so they are checked first."""
    eu = profile("p", "T4", 1, selector={"zone": "eu"})
    nodes = [
        node("us-full", "T4", 2, reserved=2, labels={"zone": "us"}),
        node("us-free", "T4", 2, labels={"zone": "us"}),
        node("eu-full", "T4", 2, reserved=2, labels={"zone": "eu"}),
    ]

    (unplaced,) = run([demand("m", 1, eu)], nodes).unplaced

    assert unplaced.reason == ("profile p: 0/3 nodes fit: 2 lack label zone=eu, 1 has no free GPU")


def test_the_counts_are_there_as_data_for_an_api() -> None:
    busy = node("busy", reserved=8, labels={"zone": "eu"})
    nodes = [node("t4", "T4", 2), busy, node("other", labels={"zone": "us"})]

    result = run([demand("m", 1, profile("p", selector={"zone": "eu"}, memory_gb=64))], nodes)

    assert result.unplaced[0].rejections == (
        ProfileRejections(
            profile="p",
            nodes_total=3,
            nodes_fit=0,
            gpu_class_wanted="A100",
            wrong_gpu_class={"T4": 1},
            gpus_needed=8,
            too_few_gpus=1,
            missing_labels={"zone=eu": 1},
            memory_needed_gb=64,
        ),
    )


def test_each_node_is_counted_once_under_its_first_failing_check() -> None:
    # Wrong class, no free cards, no label and too little memory all at once:
    # the node counts as a gpu_class refusal only.
    hopeless = node("hopeless", "T4", 2, reserved=2, memory_gb=8)

    result = run([demand("m", 1, profile(selector={"zone": "eu"}, memory_gb=64))], [hopeless])

    assert result.unplaced[0].reason == "profile a100x8: 0/1 nodes fit: 1 gpu_class is T4 not A100"


def test_memory_is_named_with_the_amount_needed() -> None:
    nodes = [cpu_node("small", memory_gb=16), cpu_node("smaller", memory_gb=8)]

    result = run([demand("m", 1, cpu_profile("q4", memory_gb=40))], nodes)

    assert result.unplaced[0].reason == (
        "profile q4: 0/2 nodes fit: 2 have less than 40 GB free memory"
    )


def test_one_card_short_reads_as_no_free_gpu() -> None:
    result = run([demand("m", 1, profile("p", "T4", 1))], [node("t", "T4", 1, reserved=1)])

    assert result.unplaced[0].reason == "profile p: 0/1 nodes fit: 1 has no free GPU"


def test_a_gpu_profile_on_cpu_nodes_says_they_have_no_gpu() -> None:
    result = run([demand("m", 1, profile("p"))], [cpu_node("c1"), cpu_node("c2")])

    assert result.unplaced[0].reason == "profile p: 0/2 nodes fit: 2 have no GPU"


def test_an_empty_inventory_is_named() -> None:
    result = run([demand("m", 1, profile("p"))], [])

    assert result.unplaced[0].reason == "profile p: 0/0 nodes fit (no nodes are reported)"


def test_every_unplaced_replica_of_a_model_carries_the_explanation() -> None:
    result = run([demand("m", 3, profile("p"))], [node("a")])

    assert [u.replica for u in result.unplaced] == [1, 2]
    assert {u.reason for u in result.unplaced} == {
        "profile p: 0/1 nodes fit: 1 has fewer than 8 free GPUs"
    }


def test_a_gang_explanation_names_the_largest_fabric_group() -> None:
    rejections = ProfileRejections(
        profile="g",
        nodes_total=10,
        nodes_fit=5,
        nodes_needed=4,
        largest_fabric_group=3,
        fit_without_fabric=2,
        gpu_class_wanted="A100",
        wrong_gpu_class={"T4": 5},
    )

    assert render_profile(rejections) == (
        "profile g: 5/10 nodes fit but no fabric has 4 of them "
        "(the most on one fabric is 3; 2 have no fabric): 5 gpu_class is T4 not A100"
    )
