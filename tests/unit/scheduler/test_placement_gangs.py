"""Multi-node replicas: one fabric, distinct nodes, all or nothing."""

from __future__ import annotations

from tests.unit.scheduler.placement_builders import demand, hosts, node, profile, run


def test_a_multi_node_replica_is_placed_on_distinct_nodes_sharing_a_fabric() -> None:
    nodes = [node("a", fabric="ib-1"), node("b", fabric="ib-1"), node("c", fabric="ib-2")]

    result = run([demand("m", 1, profile("2x8", nodes=2))], nodes)

    assert hosts(result, "m") == [("a", "b")]
    assert result.place[0].gpus_per_node == 8


def test_a_multi_node_replica_never_spans_two_fabrics() -> None:
    nodes = [node("a", fabric="ib-1"), node("b", fabric="ib-2")]

    result = run([demand("m", 1, profile("2x8", nodes=2))], nodes)

    assert result.place == ()
    assert "2/2 nodes fit but no fabric has 2 of them" in result.unplaced[0].reason


def test_a_multi_node_replica_is_placed_all_or_nothing() -> None:
    # Only one node of the fabric has room: the gang must not take it and
    # leave half a replica behind, so the small model still gets that node.
    nodes = [node("a", fabric="ib-1"), node("b", fabric="ib-1", reserved=4)]
    gang = demand("gang", 1, profile("2x8", nodes=2))
    small = demand("small", 1, profile("whole", gpus=8))

    result = run([gang, small], nodes)

    assert hosts(result, "gang") == []
    assert hosts(result, "small") == [("a",)]
    # Explained as things stand after the round, when "small" holds node a.
    assert result.unplaced[0].reason == (
        "profile 2x8: 0/2 nodes fit, 2 needed on one fabric: 2 have fewer than 8 free GPUs"
    )


def test_nodes_without_a_fabric_cannot_host_a_multi_node_replica() -> None:
    result = run([demand("m", 1, profile("2x8", nodes=2))], [node("a"), node("b")])

    assert result.place == ()
    assert result.unplaced[0].reason == (
        "profile 2x8: 2/2 nodes fit but no fabric has 2 of them (2 have no fabric)"
    )


def test_a_gang_takes_the_fabric_that_leaves_the_fewest_cards_idle() -> None:
    nodes = [
        node("roomy-1", gpus=8, fabric="big"),
        node("roomy-2", gpus=8, fabric="big"),
        node("snug-1", gpus=4, fabric="small"),
        node("snug-2", gpus=4, fabric="small"),
    ]

    result = run([demand("m", 1, profile("2x4", gpus=4, nodes=2))], nodes)

    assert hosts(result, "m") == [("snug-1", "snug-2")]


def test_gang_replicas_fill_a_fabric_before_falling_back() -> None:
    nodes = [node(f"n{i}", fabric="ib") for i in range(4)]
    gang = profile("2x8", nodes=2, priority=1)
    single = profile("1x8", priority=0)

    result = run([demand("m", 3, gang, single)], nodes)

    assert [(p.profile, p.nodes) for p in result.placements] == [
        ("2x8", ("n0", "n1")),
        ("2x8", ("n2", "n3")),
    ]
    assert result.unplaced[0].replica == 2
