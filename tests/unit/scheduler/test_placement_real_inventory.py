"""A realistic catalog on the 1,213 GPU nodes of Alibaba's openb trace.

The trace has no labels or fabrics, so the test gives them: alternate nodes
are in zone eu and us, and the 39 G3 nodes sit on InfiniBand fabrics of 8
(8, 8, 8, 8, 7 nodes), which is room for 4 + 4 + 4 + 4 + 3 = 19 two-node
replicas. The expected counts below follow from the trace's card counts.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from bench.placement.openb import load_openb_csv
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand
from tests.unit.scheduler.placement_builders import (
    NOW,
    OPENB_CSV_CANDIDATES,
    cpu_profile,
    overcommitted,
    profile,
    run,
)


@pytest.fixture(scope="module")
def openb_nodes() -> list[Node]:
    path = next((p for p in OPENB_CSV_CANDIDATES if p.exists()), None)
    if path is None:
        pytest.skip("the openb node list is in neither tests/data nor ../shared/data")
    nodes = load_openb_csv(path, reported_at=NOW)
    g3_seen = 0
    labelled = []
    for index, n in enumerate(nodes):
        fabric = None
        if n.gpu_class == "G3":
            fabric = f"g3-ib-{g3_seen // 8}"
            g3_seen += 1
        zone = "eu" if index % 2 == 0 else "us"
        labelled.append(replace(n, labels={"zone": zone}, fabric=fabric))
    return labelled


CATALOG = [
    Demand(
        "llama-70b",
        20,
        (
            profile("g3-2x8", "G3", 8, nodes=2, priority=20),
            profile("g2-tp8", "G2", 8, priority=10),
        ),
    ),
    Demand(
        "qwen-32b",
        30,
        (
            profile("v100m32-tp8", "V100M32", 8, priority=10),
            profile("v100m16-tp8", "V100M16", 8, priority=5),
            profile("g2-tp8", "G2", 8, priority=1),
        ),
    ),
    Demand(
        "llama-8b",
        600,
        (
            profile("t4-tp2", "T4", 2, priority=10),
            profile("p100-tp2", "P100", 2, priority=5),
            profile("g2-tp1", "G2", 1, priority=1),
        ),
    ),
    Demand(
        "qwen-0.5b",
        50,
        (cpu_profile("llamacpp-q4", memory_gb=16, selector={"zone": "eu"}),),
    ),
    Demand(
        "deepseek-v3",
        2,
        (
            profile("g2-4x8", "G2", 8, nodes=4, priority=10),
            profile("a100-tp8", "A100", 8, priority=5),
        ),
    ),
]


def test_a_realistic_catalog_fills_the_cluster_as_expected(openb_nodes: list[Node]) -> None:
    result = run(CATALOG, openb_nodes)

    placed = Counter((p.model, p.profile) for p in result.placements)
    assert placed == {
        ("llama-70b", "g3-2x8"): 19,
        ("llama-70b", "g2-tp8"): 1,
        ("qwen-32b", "v100m32-tp8"): 21,
        ("qwen-32b", "v100m16-tp8"): 8,
        ("qwen-32b", "g2-tp8"): 1,
        # 387 two-card T4 nodes hold one each and 17 four-card ones two each.
        ("llama-8b", "t4-tp2"): 421,
        ("llama-8b", "p100-tp2"): 131,
        ("llama-8b", "g2-tp1"): 48,
        ("qwen-0.5b", "llamacpp-q4"): 50,
    }
    assert overcommitted(result.placements, openb_nodes) == []


def test_replicas_of_one_model_go_on_distinct_nodes_while_there_are_any(
    openb_nodes: list[Node],
) -> None:
    result = run(CATALOG, openb_nodes)

    # Best fit alone stacked these 48 on 6 nodes: 6 node failures took them all.
    g2_hosts = {p.nodes for p in result.placements if p.profile == "g2-tp1"}
    assert len(g2_hosts) == 48


def test_what_cannot_fit_is_explained(openb_nodes: list[Node]) -> None:
    result = run(CATALOG, openb_nodes)

    assert [(u.model, u.replica) for u in result.unplaced] == [
        ("deepseek-v3", 0),
        ("deepseek-v3", 1),
    ]
    # 549 G2 nodes, of which 2 are taken whole by 8-card replicas and 48 hold
    # one single-card replica each (spread); none has a fabric.
    assert result.unplaced[0].reason == (
        "profile g2-4x8: 499/1213 nodes fit but no fabric has 4 of them (499 have no fabric): "
        "664 gpu_class is not G2 (404 T4, 134 P100, 55 V100M16, 39 G3, 30 V100M32, 2 A10), "
        "50 have fewer than 8 free GPUs; "
        "profile a100-tp8: 0/1213 nodes fit: 1213 gpu_class is not A100 "
        "(549 G2, 404 T4, 134 P100, 55 V100M16, 39 G3, 30 V100M32, 2 A10)"
    )


def test_the_plan_is_the_same_whatever_order_the_nodes_arrive_in(
    openb_nodes: list[Node],
) -> None:
    shuffled = list(openb_nodes)
    random.Random(7).shuffle(shuffled)

    assert run(CATALOG, shuffled) == run(CATALOG, openb_nodes)


def test_the_next_round_with_nothing_changed_keeps_everything(openb_nodes: list[Node]) -> None:
    first = run(CATALOG, openb_nodes)

    second = run(CATALOG, openb_nodes, first.placements)

    assert not second.changes_anything
    assert second.keep == first.placements
