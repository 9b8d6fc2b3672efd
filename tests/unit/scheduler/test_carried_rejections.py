"""Rejection counts carried from round to round are the counts made afresh.

``RejectionMemo`` keeps each profile's counts and recounts only the nodes whose freshness,
cordon or free room changed since the round before; whatever changes between rounds, its
counts must be exactly ``count_rejections``'.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.planner.fleet.rejections import RejectionMemo, count_rejections
from tests.unit.scheduler.placement_builders import node, profile

NODES = [
    node(
        f"n{i}",
        gpu_class=(None, "A100", "A100", "H100")[i % 4],
        gpus=0 if i % 4 == 0 else 8,
        memory_gb=None if i % 5 == 0 else 80.0,
        labels={"zone": "eu" if i % 3 else "us"},
        fabric=None if i % 2 else f"f{i % 3}",
    )
    for i in range(12)
]
NAMES = [n.name for n in NODES]
PROFILES = [
    profile("a100x8", "A100", 8),
    profile("a100x2", "A100", 2, selector={"zone": "eu"}, memory_gb=40),
    profile("h100x4", "H100", 4, nodes=2),
    profile("cpu", None, 0, memory_gb=20),
]


@dataclass
class Room:
    gpus: dict[str, int]
    memory: dict[str, float | None]

    def free_gpus(self, name: str) -> int:
        return self.gpus[name]

    def free_memory(self, name: str) -> float | None:
        return self.memory[name]


# The strategies drawn from below, made once (as in test_round_chain.py): built inline,
# each draw made new strategy objects for Hypothesis to validate and label again.
_NAMES = st.sets(st.sampled_from(NAMES))
_GPUS = st.integers(min_value=-1, max_value=8)
_MEMORY = st.sampled_from([None, 0.0, 30.0, 80.0])
_VERSION = st.sampled_from([1, 1, 1, 2, None])
_AVOID = st.sets(st.sampled_from(NAMES), max_size=2)


@st.composite
def rounds(draw: st.DrawFn) -> tuple[object, frozenset[str], frozenset[str], Room, object]:
    fresh = frozenset(draw(_NAMES))
    closed = frozenset(draw(_NAMES)) & fresh
    room = Room(
        {n: draw(_GPUS) for n in NAMES},
        {n: draw(_MEMORY) for n in NAMES},
    )
    version = draw(_VERSION)
    avoid = frozenset(draw(_AVOID))
    return version, fresh, closed, room, avoid


@pytest.mark.slow  # (tests/xdist_groups.py: handed out first)
@settings(max_examples=300, deadline=None)
@given(st.lists(rounds(), min_size=1, max_size=6), st.data())
def test_counts_carried_from_round_to_round_are_the_counts_made_afresh(
    sequence: list[tuple[object, frozenset[str], frozenset[str], Room, frozenset[str]]],
    data: st.DataObject,
) -> None:
    memo = RejectionMemo()
    for version, fresh, closed, room, avoid in sequence:
        memo.advance(
            version,
            NODES,
            fresh=fresh,
            closed=closed,
            gpus=dict(room.gpus),
            memory=dict(room.memory),
        )
        asked = data.draw(st.lists(st.sampled_from(PROFILES), unique_by=lambda p: p.name))
        for p in asked:
            avoided = avoid if p.name != "cpu" else frozenset()
            carried = memo.count((p.name, avoided), p, NODES, capacity=room, avoid=avoided)
            afresh = count_rejections(
                p, NODES, fresh=fresh, capacity=room, closed=closed, avoid=avoided
            )
            assert carried == afresh


def test_a_node_lost_is_recounted_not_counted_afresh() -> None:
    memo = RejectionMemo()
    room = Room(dict.fromkeys(NAMES, 8), dict.fromkeys(NAMES, 80.0))
    everyone = frozenset(NAMES)
    for fresh in (everyone, everyone - {"n1"}):
        memo.advance(
            1, NODES, fresh=fresh, closed=frozenset(), gpus=dict(room.gpus), memory=room.memory
        )
        counted = memo.count("a100x8", PROFILES[0], NODES, capacity=room)
        assert counted == count_rejections(PROFILES[0], NODES, fresh=fresh, capacity=room)
    assert memo.recounted == 1
    assert counted.stale == 1
