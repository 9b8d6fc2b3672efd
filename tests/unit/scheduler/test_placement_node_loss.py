"""Silent nodes: stale ones keep their replicas, lost ones give them up, unless most go at once."""

from __future__ import annotations

from datetime import timedelta

from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.planner.fleet.placements import Placement
from tests.unit.scheduler.placement_builders import demand, hosts, node, run

MINUTE = timedelta(minutes=1)


def on(node_name: str, replica: int = 0, model: str = "m") -> Placement:
    return Placement(model, replica, "a100x8", (node_name,), 8, "A100", 0)


def test_a_stale_node_within_grace_keeps_its_replicas() -> None:
    nodes = [node("quiet", silent_for=3 * MINUTE), node("spare")]

    result = run([demand("m", 1)], nodes, [on("quiet")])

    assert result.keep == (on("quiet"),)
    assert result.remove == ()
    assert result.lost_nodes == ()


def test_a_node_silent_beyond_grace_loses_its_replicas_to_another_node() -> None:
    # Default policy: stale after 90s, lost 5 minutes after that.
    nodes = [node("quiet", silent_for=6 * MINUTE + timedelta(seconds=31)), node("spare")]

    result = run([demand("m", 1)], nodes, [on("quiet")])

    assert [r.reason for r in result.remove] == ["node quiet lost (not heard from for 6m31s)"]
    assert hosts(result, "m") == [("spare",)]
    assert result.lost_nodes == ("quiet",)
    assert not result.mass_loss


def test_a_node_gone_from_the_inventory_loses_its_replicas() -> None:
    result = run([demand("m", 1)], [node("spare")], [on("gone")])

    assert [r.reason for r in result.remove] == ["node gone lost (no longer in the inventory)"]
    assert hosts(result, "m") == [("spare",)]


def test_the_grace_period_comes_from_the_policy() -> None:
    policy = StalenessPolicy(stale_after=timedelta(seconds=30), grace=timedelta(seconds=30))
    nodes = [node("quiet", silent_for=2 * MINUTE), node("spare")]

    result = run([demand("m", 1)], nodes, [on("quiet")], policy=policy)

    assert hosts(result, "m") == [("spare",)]


def test_losing_most_hosting_nodes_at_once_keeps_their_replicas_and_says_so() -> None:
    # Every node silent at once looks like the control plane's clock or network,
    # not like the cluster burning down: wiping it would turn a blip into an outage.
    nodes = [node(f"n{i}", silent_for=20 * MINUTE) for i in range(4)]
    current = [on(f"n{i}", i) for i in range(4)]

    result = run([demand("m", 4)], nodes, current)

    assert result.mass_loss
    assert result.keep == tuple(current)
    assert result.remove == ()
    assert result.lost_nodes == ("n0", "n1", "n2", "n3")


def test_an_empty_inventory_does_not_wipe_the_cluster() -> None:
    current = [on(f"n{i}", i) for i in range(3)]

    result = run([demand("m", 3)], [], current)

    assert result.mass_loss
    assert result.keep == tuple(current)


def test_a_second_round_during_a_mass_loss_decides_the_same() -> None:
    silent = [node(f"n{i}", silent_for=20 * MINUTE) for i in range(3)]
    nodes = [*silent, node("fresh")]
    current = [on("n0", 0), on("n1", 1), on("n2", 2)]
    demands = [demand("m", 4)]
    first = run(demands, nodes, current)

    second = run(demands, nodes, first.placements)

    assert first.mass_loss
    assert hosts(first, "m") == [("n0",), ("n1",), ("n2",), ("fresh",)]
    assert second.mass_loss
    assert not second.changes_anything


def test_losing_a_few_nodes_of_a_large_cluster_is_not_a_mass_loss() -> None:
    nodes = [node(f"n{i}") for i in range(8)] + [
        node("gone-1", silent_for=20 * MINUTE),
        node("gone-2", silent_for=20 * MINUTE),
    ]
    current = [on("gone-1", 0), on("gone-2", 1), on("n0", 2)]

    result = run([demand("m", 3)], nodes, current)

    assert not result.mass_loss
    assert sorted(r.placement.replica for r in result.remove) == [0, 1]
    assert len(result.placements) == 3


def test_losing_the_only_node_is_a_loss_not_a_mass_loss() -> None:
    result = run([demand("m", 1)], [node("only", silent_for=20 * MINUTE)], [on("only")])

    assert not result.mass_loss
    assert [r.placement for r in result.remove] == [on("only")]
    assert "1 is stale" in result.unplaced[0].reason
