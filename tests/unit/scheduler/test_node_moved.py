"""``reported_at``: a node moved to another report time by its constructor, the same node
``dataclasses.replace`` makes (a field added to ``Node`` and not to it fails here)."""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from scheduler.planner.fleet.inventory import Node, reported_at

TIMES = st.datetimes(timezones=st.just(UTC))
NODES = st.builds(
    Node,
    name=st.text(min_size=1, max_size=8),
    gpu_class=st.none() | st.sampled_from(["A100", "H100"]),
    gpus=st.integers(0, 8),
    memory_gb=st.none() | st.floats(0, 2048),
    reported_at=TIMES,
    labels=st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
    fabric=st.none() | st.text(max_size=4),
    gpus_reserved=st.integers(0, 8),
)


@given(NODES, TIMES)
def test_a_node_moved_to_another_time_is_what_replace_makes(node: Node, at: datetime) -> None:
    moved = reported_at(node, at)
    assert moved == replace(node, reported_at=at)
    others = [f.name for f in fields(Node) if f.name != "reported_at"]
    assert all(getattr(moved, name) is getattr(node, name) for name in others)
