"""Capacity's kept structures answer as the plain searches do (issue 42, item 3).

- A settled capacity's pools (``PoolMemo``: kept from round to round, patched by the nodes
  whose room or freshness changed, and brought up to date by what was consumed since) give
  the same best fit, first fit, eligible nodes and fitting order as pools sorted afresh.
- Gangs (``Capacity.best_gang``, ``first_gang``, ``ranked_gang``: each fabric's group kept
  as capacity is consumed) choose what a scan of every fitting node chooses.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.capacity import Capacity, PoolMemo
from scheduler.planner.fleet.inventory import Node
from tests.unit.scheduler.placement_builders import cpu_profile, node, profile

PROFILES = [
    profile("one", "A100", 1),
    profile("four", "A100", 4, memory_gb=64),
    profile("eu", "A100", 2, selector={"zone": "eu"}),
    profile("l4", "L4", 1),
    cpu_profile(memory_gb=32),
]
GANGS = [profile("pair", "A100", 4, nodes=2), profile("three", "A100", 1, nodes=3, memory_gb=64)]


# A node's parts, built once rather than inside each draw (where each list's strategy was
# built and validated again every time): the same strategies, the same examples. node()
# copies the labels it is given, so the drawn dicts are never shared between nodes.
_CLASSES = st.sampled_from(["A100", "A100", "L4", None])
_CARDS = st.sampled_from([1, 4, 8])
_MEMORY = st.sampled_from([None, 128.0, 256.0, 100.5])
_LABELS = st.sampled_from([{}, {"zone": "eu"}, {"zone": "us"}])
_FABRICS = st.sampled_from([None, "f1", "f2", "f3"])
_RESERVED = st.sampled_from([0, 0, 1])
_COUNT = st.integers(min_value=1, max_value=24)
# And `_takes`'s, those drawn from a fleet's names once for each fleet's names.
_TAKE_GPUS = st.sampled_from([0, 1, 2, 4])
_TAKE_MEMORY = st.sampled_from([0, 16, 64])


@functools.cache
def _name(names: tuple[str, ...]) -> st.SearchStrategy[str]:
    return st.sampled_from(names)


@functools.cache
def _names(
    names: tuple[str, ...], min_size: int = 0, max_size: int | None = None, unique: bool = False
) -> st.SearchStrategy[list[str]]:
    return st.lists(_name(names), min_size=min_size, max_size=max_size, unique=unique)


@st.composite
def fleets(draw: st.DrawFn) -> list[Node]:
    count = draw(_COUNT)
    return [
        node(
            f"n{i:02d}",
            draw(_CLASSES),
            draw(_CARDS),
            memory_gb=draw(_MEMORY),
            labels=draw(_LABELS),
            fabric=draw(_FABRICS),
            reserved=draw(_RESERVED),
        )
        for i in range(count)
    ]


Take = tuple[tuple[str, ...], int, int]


def _takes(names: list[str]) -> st.SearchStrategy[list[Take]]:
    return _takes_from(tuple(names))


@functools.cache
def _takes_from(names: tuple[str, ...]) -> st.SearchStrategy[list[Take]]:
    return st.lists(
        st.tuples(
            _names(names, min_size=1, max_size=2, unique=True).map(tuple),
            _TAKE_GPUS,
            _TAKE_MEMORY,
        ),
        max_size=12,
    )


def _answers(capacity: Capacity, avoid: Collection[str]) -> list[object]:
    out: list[object] = []
    for p in PROFILES:
        out += [
            list(capacity.fitting(p)),
            capacity.eligible_names(p),
            capacity.best_node(p, avoid),
            capacity.first_node(p, avoid),
        ]
    return out


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_pools_kept_from_round_to_round_are_the_pools_sorted_afresh(data: st.DataObject) -> None:
    draw = data.draw
    nodes = draw(fleets())
    names = [n.name for n in nodes]
    memo = PoolMemo()
    memo.rebuild_share = draw(st.sampled_from([0, 8]))  # 0: always patched
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        fresh = frozenset(draw(st.lists(st.sampled_from(names), unique=True)))
        kept, later = draw(_takes(names)), draw(_takes(names))
        plain, carried = Capacity(nodes, fresh), Capacity(nodes, fresh)
        for c in (plain, carried):
            for taken in kept:
                c.take(*taken)
        carried.settle(memo, "v1")
        # Asked in a random order, between consumptions: each pool is built at a
        # different point, from the memo and what was consumed since.
        avoid = frozenset(draw(st.lists(st.sampled_from(names), max_size=2)))
        for taken in later:
            for c in (plain, carried):
                c.consume(*taken)
            if draw(st.booleans()):
                p = draw(st.sampled_from(PROFILES))
                assert list(carried.fitting(p)) == list(plain.fitting(p))
        assert _answers(carried, avoid) == _answers(plain, avoid)
        copy_plain, copy_carried = plain.copy(), carried.copy()
        for taken in later[:3]:
            copy_plain.release(*taken)
            copy_carried.release(*taken)
        assert _answers(copy_carried, avoid) == _answers(copy_plain, avoid)


def _gang_by_scan(
    capacity: Capacity,
    p: PlacementProfile,
    avoid: Collection[str],
    ranks: Mapping[str, int],
    nodes: Mapping[str, Node],
) -> tuple[str, ...] | None:
    """``Spread.choose_gang`` over every fitting node (the scan the kept groups replace)."""
    by_fabric: dict[str, list[tuple[int, int, float, str]]] = {}
    for level, memory, name in capacity.fitting(p, avoid):
        fabric = nodes[name].fabric
        if fabric is not None:
            by_fabric.setdefault(fabric, []).append((ranks.get(name, 0), level, memory, name))
    groups = []
    for fabric, entries in by_fabric.items():
        if len(entries) >= p.nodes:
            chosen = sorted(entries)[: p.nodes]
            groups.append(
                (
                    sum(e[0] for e in chosen),
                    sum(e[1] for e in chosen),
                    sum(e[2] for e in chosen),
                    fabric,
                    chosen,
                )
            )
    if not groups:
        return None
    return tuple(sorted(e[3] for e in min(groups, key=lambda g: g[:4])[4]))


def _first_gang_by_scan(
    capacity: Capacity, p: PlacementProfile, avoid: Collection[str], nodes: Mapping[str, Node]
) -> tuple[str, ...] | None:
    by_fabric: dict[str, list[str]] = {}
    for _, _, name in sorted(capacity.fitting(p, avoid), key=lambda e: e[2]):
        fabric = nodes[name].fabric
        if fabric is None:
            continue
        group = by_fabric.setdefault(fabric, [])
        group.append(name)
        if len(group) == p.nodes:
            return tuple(group)
    return None


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_gangs_kept_by_fabric_choose_what_a_scan_chooses(data: st.DataObject) -> None:
    draw = data.draw
    nodes = draw(fleets())
    names = [n.name for n in nodes]
    by_name = {n.name: n for n in nodes}
    fresh = frozenset(draw(st.lists(st.sampled_from(names), unique=True)))
    capacity = Capacity(nodes, fresh)
    if draw(st.booleans()):
        capacity.settle(PoolMemo(), "v1")
    for step in range(draw(st.integers(min_value=1, max_value=10))):
        p = draw(st.sampled_from(GANGS))
        avoid = frozenset(draw(st.lists(st.sampled_from(names), max_size=2)))
        ranks = {
            n: draw(st.integers(min_value=0, max_value=2))
            for n in draw(st.lists(st.sampled_from(names), max_size=3, unique=True))
        }
        assert capacity.ranked_gang(p, avoid, ranks) == _gang_by_scan(
            capacity, p, avoid, ranks, by_name
        ), step
        assert capacity.best_gang(p, avoid) == _gang_by_scan(capacity, p, avoid, {}, by_name)
        assert capacity.first_gang(p, avoid) == _first_gang_by_scan(capacity, p, avoid, by_name)
        taken = draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))
        gpus, memory = draw(st.sampled_from([1, 4, -4])), draw(st.sampled_from([0, 64, -64]))
        capacity.consume(taken, gpus, memory)


# Every kind of need ``may_fit`` is asked: cards alone, memory alone, both, neither, for
# a class, for any node (a CPU profile), and a class no node has.
MAY_FIT = [
    *PROFILES,
    profile("big", "A100", 8, memory_gb=200),
    profile("mem", "A100", 1, memory_gb=120),
    profile("h100", "H100", 1),
    cpu_profile("tiny"),
    cpu_profile("huge", memory_gb=300),
]


def _fits_by_scan(
    capacity: Capacity, nodes: list[Node], fresh: set[str], p: PlacementProfile
) -> bool:
    """``may_fit``'s answer as a scan node by node says it."""
    return any(
        n.name in fresh
        and (p.gpu_class is None or n.gpu_class == p.gpu_class)
        and (p.gpus_per_node == 0 or capacity.free_gpus(n.name) >= p.gpus_per_node)
        and (
            p.min_memory_gb <= 0
            or (free := capacity.free_memory(n.name)) is None
            or free >= p.min_memory_gb
        )
        for n in nodes
    )


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_may_fit_answers_as_a_scan_of_every_node(data: st.DataObject) -> None:
    """``may_fit`` judges the cards and the memory over a whole class first (``max``):
    the same answer as a scan node by node, after any consuming and releasing, and on
    copies (which share the classes' fresh names)."""
    nodes = data.draw(fleets())
    names = [n.name for n in nodes]
    fresh = set(data.draw(st.lists(st.sampled_from(names), unique=True)))
    capacity = Capacity(nodes, fresh)
    for step in range(3):
        for taken, gpus, memory in data.draw(_takes(names)):
            if data.draw(st.booleans()):
                capacity.release(taken, gpus, memory)
            else:
                capacity.take(taken, gpus, memory)
        for p in MAY_FIT:
            assert capacity.may_fit(p) == _fits_by_scan(capacity, nodes, fresh, p), (step, p)
        capacity = capacity.copy()
