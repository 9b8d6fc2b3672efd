"""Recorded rounds' JSON: versioned, upcast from every older shape, and checked value by value."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.lifecycle.inputs import Lifecycle
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.record_format import (
    CURRENT_SCHEMA,
    NODE,
    ROUND,
    UnreadableRow,
    inventory_digest,
    inventory_json,
    node_content,
    node_from_content,
    placement_from_record,
    placement_record,
    policy_json,
    recorded_round,
    upcast,
)
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Placement

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

names = st.text(min_size=1, max_size=12)
nodes = st.builds(
    Node,
    name=names,
    gpu_class=st.none() | st.sampled_from(["A100", "H100"]),
    gpus=st.integers(0, 16),
    memory_gb=st.none() | st.floats(0, 4096, allow_nan=False),
    reported_at=st.just(T0),
    labels=st.dictionaries(names, names, max_size=3),
    fabric=st.none() | names,
    gpus_reserved=st.integers(0, 4),
)
placements = st.builds(
    Placement,
    model=names,
    replica=st.integers(0, 64),
    profile=names,
    nodes=st.lists(names, min_size=1, max_size=3).map(tuple),
    gpus_per_node=st.integers(1, 8),
    gpu_class=st.none() | names,
    memory_gb_per_node=st.integers(0, 1024),
    fingerprint=st.text(max_size=8),
)


@given(nodes)
def test_a_node_reads_back_as_written(node: Node) -> None:
    (stored,) = json.loads(inventory_json([node]))
    assert stored["schema_version"] == CURRENT_SCHEMA[NODE]
    assert node_from_content(stored, T0) == node


@given(placements)
def test_a_placement_reads_back_as_written(p: Placement) -> None:
    assert placement_from_record(json.loads(json.dumps(placement_record(p)))) == p


@given(
    st.lists(nodes, max_size=4, unique_by=lambda n: n.name),
    st.lists(placements, max_size=3),
    st.booleans(),
    st.booleans(),
)
def test_a_round_reads_back_as_written(
    ns: list[Node], current: list[Placement], defragment: bool, repair_spread: bool
) -> None:
    policy = StalenessPolicy(
        stale_after=timedelta(seconds=30),
        preemption=False,
        defragment=defragment,
        repair_spread=repair_spread,
    )
    documents = {
        "reported_at": {n.name: n.reported_at.isoformat() for n in ns},
        "current": [placement_record(p) for p in current],
        "policy": json.loads(policy_json(policy)),
        "lifecycle": Lifecycle().to_json(),
    }
    columns = {"id": 3, "planned_at": T0, "catalog_position": 9, "placed": 1, "removed": 0}
    got = recorded_round({**columns, "unplaced": 0}, documents, json.loads(inventory_json(ns)))
    assert got.nodes == tuple(sorted(ns, key=lambda n: n.name))
    assert (got.current, got.policy, got.lifecycle) == (tuple(current), policy, Lifecycle())


def test_the_digest_ignores_versions_and_report_times() -> None:
    node = Node("n", "A100", 8, 512.0, T0)
    later = Node("n", "A100", 8, 512.0, T0 + timedelta(hours=1))
    assert inventory_digest([node]) == inventory_digest([later])
    assert "schema_version" not in node_content(node)


def test_version_one_is_every_shape_written_before_versions() -> None:
    old = {"name": "n", "gpu_class": None, "gpus": 0, "memory_gb": None}
    assert node_from_content(old, T0) == Node("n", None, 0, None, T0)
    record = upcast(
        ROUND,
        1,
        {"policy": {"grace_s": 1}, "current": [{"model": "m"}], "lifecycle": None},
    )
    assert record["policy"] == {"grace_s": 1, "preemption": True}
    assert record["current"] == [{"model": "m", "memory_gb_per_node": 0, "fingerprint": ""}]
    assert Lifecycle.from_json(record["lifecycle"]) == Lifecycle()


@pytest.mark.parametrize(
    ("version", "reason"),
    [(99, "newer than this code reads"), (0, "is not a version"), ("2", "is not a version")],
)
def test_a_version_this_code_cannot_read_is_unreadable(version: Any, reason: str) -> None:
    with pytest.raises(UnreadableRow, match=reason):
        node_from_content({"name": "n", "schema_version": version}, T0)


@pytest.mark.parametrize(
    "content",
    [
        [],
        {"name": 1, "gpu_class": None, "gpus": 0, "memory_gb": None},
        {"name": "n", "gpu_class": None, "gpus": True, "memory_gb": None},
        {"name": "n", "gpu_class": None, "gpus": 0, "memory_gb": "x"},
        {"name": "n", "gpu_class": None, "gpus": 0, "memory_gb": None, "labels": {"a": 1}},
        {"name": "n", "gpu_class": None, "gpus": 0},
    ],
)
def test_a_value_of_the_wrong_type_is_unreadable_not_a_node(content: Any) -> None:
    with pytest.raises(UnreadableRow):
        node_from_content(content, T0)
