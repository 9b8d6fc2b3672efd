"""Running replicas stay where they are unless there is a reason, and the reason is named."""

from __future__ import annotations

from dataclasses import replace

from scheduler.planner.fleet.placements import Placement
from tests.unit.scheduler.placement_builders import (
    cpu_node,
    cpu_profile,
    demand,
    node,
    profile,
    run,
)


def running(
    model: str, replica: int, *nodes: str, profile_name: str = "a100x8", gpus: int = 8
) -> Placement:
    return Placement(model, replica, profile_name, nodes or ("a",), gpus, "A100", 0)


def test_a_second_round_with_nothing_changed_changes_nothing() -> None:
    demands = [demand("m", 3, profile(gpus=4)), demand("c", 2, cpu_profile(memory_gb=8))]
    nodes = [node("a"), node("b", gpus=4), cpu_node("c", memory_gb=32)]
    first = run(demands, nodes)

    second = run(demands, nodes, first.placements)

    assert second.place == ()
    assert second.remove == ()
    assert second.keep == first.placements
    assert not second.changes_anything


def test_a_running_replica_stays_even_when_a_better_node_appears() -> None:
    current = [running("m", 0, "roomy", gpus=4)]
    nodes = [node("roomy", gpus=16), node("exact", gpus=4)]

    result = run([demand("m", 1, profile(gpus=4))], nodes, current)

    assert result.keep == tuple(current)
    assert result.place == ()


def test_a_running_replica_stays_when_a_higher_priority_profile_becomes_possible() -> None:
    cheap = profile("cheap", "T4", 2, priority=0)
    fast = profile("fast", "A100", 8, priority=10)
    current = [Placement("m", 0, "cheap", ("t",), 2, "T4", 0)]

    result = run([demand("m", 1, fast, cheap)], [node("t", "T4", 2), node("a")], current)

    assert result.keep == tuple(current)


def test_a_replica_of_a_removed_model_is_removed() -> None:
    result = run([], [node("a")], [running("gone", 0)])

    assert [(r.placement.model, r.reason) for r in result.remove] == [
        ("gone", "model removed from catalog")
    ]


def test_a_replica_of_a_removed_profile_is_replaced_with_a_remaining_one() -> None:
    current = [running("m", 0, "a", profile_name="old")]

    result = run([demand("m", 1, profile("new"))], [node("a")], current)

    assert [r.reason for r in result.remove] == ["profile old removed from the model"]
    assert [(p.profile, p.nodes) for p in result.place] == [("new", ("a",))]


def test_a_replica_whose_profile_changed_shape_is_replaced() -> None:
    current = [running("m", 0, "a", gpus=4)]

    result = run([demand("m", 1, profile(gpus=8))], [node("a")], current)

    assert [r.reason for r in result.remove] == [
        "profile a100x8 changed shape: was 1 node x 4 A100, now 1 node x 8 A100"
    ]
    assert [p.gpus_per_node for p in result.place] == [8]


def test_surplus_replicas_are_removed_highest_first() -> None:
    current = [running("m", i, f"n{i}") for i in range(4)]

    result = run([demand("m", 2)], [node(f"n{i}") for i in range(4)], current)

    assert [r.placement.replica for r in result.remove] == [3, 2]
    assert {r.reason for r in result.remove} == {"surplus replica (the model wants 2)"}
    assert [p.replica for p in result.keep] == [0, 1]


def test_a_running_replica_in_a_high_slot_is_kept_and_a_low_slot_filled_instead() -> None:
    # Slots 1-4 went with their nodes; the model now wants 3. Slot 5 keeps running.
    current = [running("m", 0, "n0"), running("m", 5, "n5")]

    result = run([demand("m", 3)], [node(f"n{i}") for i in range(6)], current)

    assert result.remove == ()
    assert [p.replica for p in result.keep] == [0, 5]
    assert [p.replica for p in result.place] == [1]
    again = run([demand("m", 3)], [node(f"n{i}") for i in range(6)], result.placements)
    assert not again.changes_anything


def test_a_node_that_shrank_gives_up_its_latest_replicas() -> None:
    current = [running("m", i, "a", gpus=2) for i in range(4)]

    result = run([demand("m", 4, profile(gpus=2))], [node("a", gpus=8, reserved=4)], current)

    assert [p.replica for p in result.keep] == [0, 1]
    assert [(r.placement.replica, r.reason) for r in result.remove] == [
        (3, "node a no longer has room: needs 2 GPUs, 0 free"),
        (2, "node a no longer has room: needs 2 GPUs, 0 free"),
    ]
    assert [u.replica for u in result.unplaced] == [2, 3]


def test_a_node_that_lost_its_selector_label_gives_up_its_replica() -> None:
    eu_only = profile(selector={"zone": "eu"})
    nodes = [node("a", labels={"zone": "us"}), node("b", labels={"zone": "eu"})]

    result = run([demand("m", 1, eu_only)], nodes, [running("m", 0, "a")])

    assert [r.reason for r in result.remove] == ["node a no longer fits: lacks label zone=eu"]
    assert [p.nodes for p in result.place] == [("b",)]


def test_a_kept_replica_is_recorded_with_its_profiles_current_memory_need() -> None:
    current = [running("m", 0, "a")]

    result = run([demand("m", 1, profile(memory_gb=64))], [node("a", memory_gb=128)], current)

    assert result.remove == ()
    assert result.keep == (replace(current[0], memory_gb_per_node=64),)


def test_a_raised_memory_need_the_node_cannot_meet_removes_the_replica() -> None:
    current = [running("m", 0, "a")]

    result = run([demand("m", 1, profile(memory_gb=256))], [node("a", memory_gb=128)], current)

    assert [r.reason for r in result.remove] == [
        "node a no longer has room: needs 256 GB memory, 128 GB free"
    ]


def test_two_placements_of_one_replica_slot_keep_only_one() -> None:
    current = [running("m", 0, "b"), running("m", 0, "a")]

    result = run([demand("m", 1)], [node("a"), node("b")], current)

    assert [p.nodes for p in result.keep] == [("a",)]
    assert [r.reason for r in result.remove] == ["another placement already holds replica 0"]


def test_the_plan_does_not_depend_on_the_order_of_current_placements() -> None:
    current = [running("m", i, "a", gpus=2) for i in range(5)]
    demands = [demand("m", 5, profile(gpus=2))]
    nodes = [node("a", gpus=8)]

    assert run(demands, nodes, current) == run(demands, nodes, current[::-1])
