"""The spread repair's index of movable new replicas: by shape, then by the nodes they run on.

A swap partner must have the same shape (``Shape``: GPU class, GPUs per node,
memory per node, node count, priority). Within a shape, replicas are kept by
the node tuple they occupy, tuples in name order, so a candidate scans the
shape's nodes from a cursor and skips a whole node (often dozens of stacked
replicas) with one look-up. Part of ``scheduler.planner.spread_repair``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterator
from itertools import islice

from scheduler.planner.placements import Placement

Shape = tuple[str | None, int, int, int, int]


def shape_of(p: Placement, priority: int) -> Shape:
    """Partners share the shape and the priority: then every node keeps not only its
    use but which priorities hold it, so a replica left unplaced finds no new room
    to preempt in the next round either."""
    return (p.gpu_class, p.gpus_per_node, p.memory_gb_per_node, len(p.nodes), priority)


class Group:
    """New replicas of one shape by the nodes they run on, nodes in name order."""

    __slots__ = ("_at", "_keys", "cursor")

    def __init__(self) -> None:
        self._at: dict[tuple[str, ...], list[int]] = {}
        self._keys: list[tuple[str, ...]] = []
        self.cursor: tuple[str, ...] = ()

    def add(self, nodes: tuple[str, ...], index: int) -> None:
        members = self._at.get(nodes)
        if members is None:
            members = self._at[nodes] = []
            insort(self._keys, nodes)
        members.append(index)

    def remove(self, nodes: tuple[str, ...], index: int) -> None:
        members = self._at[nodes]
        members.remove(index)
        if not members:
            del self._at[nodes]
            del self._keys[bisect_left(self._keys, nodes)]

    def settle(
        self, slot: Callable[[int], tuple[str, int]], nodes: tuple[str, ...] | None = None
    ) -> None:
        """Members of each node (or of ``nodes`` only) in (model, replica) order."""
        for key in (nodes,) if nodes is not None else self._keys:
            self._at[key].sort(key=slot)

    def members(self) -> Iterator[int]:
        for members in self._at.values():
            yield from members

    def at(self, nodes: tuple[str, ...]) -> list[int]:
        return self._at.get(nodes, [])

    def keys_from(self, cursor: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        """Every node (tuple) holding members, from the first after ``cursor``, wrapping.

        The group must not change while this is read.
        """
        keys = self._keys
        start = bisect_right(keys, cursor)
        yield from islice(keys, start, None)
        yield from islice(keys, 0, start)
