"""Counting rejections by GPU class in bulk gives exactly the node-by-node counts."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.fit import Check, misfit
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.rejections import ClassIndex, count_rejections

NOW = datetime(2026, 12, 1, tzinfo=UTC)
CLASSES = [None, "A100", "T4", "L4"]


class Free:
    def __init__(self, gpus: dict[str, int], memory: dict[str, float | None]) -> None:
        self.gpus, self.memory = gpus, memory

    def free_gpus(self, name: str) -> int:
        return self.gpus[name]

    def free_memory(self, name: str) -> float | None:
        return self.memory[name]


# Built once (a strategy made inside a draw is built and validated again at every draw):
# the same strategies, so the same examples, at a fraction of the CPU.
_COUNTS = st.integers(min_value=0, max_value=25)
_CLASS = st.sampled_from(CLASSES)
_MEMORY_GB = st.sampled_from([None, 16.0, 64.0])
_LABELS = st.sampled_from([{}, {"zone": "eu"}, {"zone": "us"}])
_FABRIC = st.sampled_from([None, "ib-1", "ib-2"])
_FRESH = st.booleans()
_FREE_GPUS = st.integers(min_value=0, max_value=8)
_FREE_MEMORY = st.sampled_from([None, 8.0, 32.0])


@st.composite
def inventories(draw: st.DrawFn) -> tuple[list[Node], set[str], Free]:
    count = draw(_COUNTS)
    nodes, fresh, gpus, memory = [], set(), {}, {}
    for i in range(count):
        gpu_class = draw(_CLASS)
        name = f"n{i}"
        nodes.append(
            Node(
                name=name,
                gpu_class=gpu_class,
                gpus=0 if gpu_class is None else 8,
                memory_gb=draw(_MEMORY_GB),
                reported_at=NOW,
                labels=draw(_LABELS),
                fabric=draw(_FABRIC),
            )
        )
        if draw(_FRESH):
            fresh.add(name)
        gpus[name] = draw(_FREE_GPUS)
        memory[name] = draw(_FREE_MEMORY)
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


@settings(max_examples=300, deadline=None)
@given(inventories(), profiles, st.sets(st.sampled_from([f"n{i}" for i in range(25)])), st.data())
def test_counts_are_the_first_misfit_of_each_node(
    inventory: tuple[list[Node], set[str], Free],
    profile: PlacementProfile,
    avoid: set[str],
    data: st.DataObject,
) -> None:
    """The counting loop is ``misfit`` inlined: node by node, the same first failing check."""
    nodes, fresh, capacity = inventory
    closed = data.draw(st.sets(st.sampled_from([n.name for n in nodes]))) if nodes else set()
    counted = count_rejections(
        profile, nodes, fresh=fresh, capacity=capacity, closed=closed, avoid=avoid
    )
    failures: Counter[tuple[Check, str]] = Counter()
    fabrics: Counter[str] = Counter()
    without_fabric = 0
    for node in nodes:
        failure = misfit(
            node,
            profile,
            fresh=node.name in fresh,
            free_gpus=capacity.free_gpus(node.name),
            free_memory_gb=capacity.free_memory(node.name),
            closed=node.name in closed,
            backing_off=node.name in avoid,
        )
        if failure is not None:
            failures[failure.check, failure.detail] += 1
        elif node.fabric is None:
            without_fabric += 1
        else:
            fabrics[node.fabric] += 1
    classes = {d: n for (c, d), n in failures.items() if c is Check.GPU_CLASS}
    assert counted.nodes_fit == len(nodes) - sum(failures.values())
    assert counted.stale == failures[Check.STALE, ""]
    assert counted.cordoned == failures[Check.CORDONED, ""]
    assert counted.backing_off == failures[Check.BACKOFF, ""]
    assert counted.too_few_gpus == failures[Check.FREE_GPUS, ""]
    assert counted.too_little_memory == failures[Check.MEMORY, ""]
    assert dict(counted.wrong_gpu_class) == {c: n for c, n in classes.items() if c}
    assert counted.without_gpus == classes.get("", 0)
    assert dict(counted.missing_labels) == {
        d: n for (c, d), n in failures.items() if c is Check.LABELS
    }
    assert counted.fit_without_fabric == without_fabric
    assert counted.largest_fabric_group == max(fabrics.values(), default=0)
