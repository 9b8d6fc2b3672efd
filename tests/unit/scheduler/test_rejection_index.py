"""Counting rejections by GPU class in bulk gives exactly the node-by-node counts."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.views import PlacementProfile
from scheduler.inventory import Node
from scheduler.rejections import ClassIndex, count_rejections

NOW = datetime(2026, 12, 1, tzinfo=UTC)
CLASSES = [None, "A100", "T4", "L4"]


class Free:
    def __init__(self, gpus: dict[str, int], memory: dict[str, float | None]) -> None:
        self.gpus, self.memory = gpus, memory

    def free_gpus(self, name: str) -> int:
        return self.gpus[name]

    def free_memory(self, name: str) -> float | None:
        return self.memory[name]


@st.composite
def inventories(draw: st.DrawFn) -> tuple[list[Node], set[str], Free]:
    count = draw(st.integers(min_value=0, max_value=25))
    nodes, fresh, gpus, memory = [], set(), {}, {}
    for i in range(count):
        gpu_class = draw(st.sampled_from(CLASSES))
        name = f"n{i}"
        nodes.append(
            Node(
                name=name,
                gpu_class=gpu_class,
                gpus=0 if gpu_class is None else 8,
                memory_gb=draw(st.sampled_from([None, 16.0, 64.0])),
                reported_at=NOW,
                labels=draw(st.sampled_from([{}, {"zone": "eu"}, {"zone": "us"}])),
                fabric=draw(st.sampled_from([None, "ib-1", "ib-2"])),
            )
        )
        if draw(st.booleans()):
            fresh.add(name)
        gpus[name] = draw(st.integers(min_value=0, max_value=8))
        memory[name] = draw(st.sampled_from([None, 8.0, 32.0]))
    return nodes, fresh, Free(gpus, memory)


profiles = st.builds(
    PlacementProfile,
    name=st.just("p"),
    engine=st.just("vllm"),
    gpu_class=st.sampled_from([*CLASSES, "H100"]),
    gpus_per_node=st.integers(min_value=0, max_value=8),
    nodes=st.integers(min_value=1, max_value=3),
    priority=st.just(0),
    node_selector=st.sampled_from([{}, {"zone": "eu"}]),
    min_memory_gb=st.sampled_from([0, 16]),
)


@settings(max_examples=300, deadline=None)
@given(inventories(), profiles)
def test_counting_by_class_gives_the_same_explanation(
    inventory: tuple[list[Node], set[str], Free], profile: PlacementProfile
) -> None:
    nodes, fresh, capacity = inventory
    plain = count_rejections(profile, nodes, fresh=fresh, capacity=capacity)
    indexed = count_rejections(
        profile, nodes, fresh=fresh, capacity=capacity, index=ClassIndex.of(nodes, fresh)
    )
    assert indexed == plain
