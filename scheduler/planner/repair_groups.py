"""The spread repair's index of movable new replicas: by shape, then by the nodes they run on.

A swap partner must have the same shape (``Shape``: GPU class, GPUs per node,
memory per node, node count, priority). Within a shape, replicas are kept by
the node tuple they occupy, tuples in name order, so a candidate scans the
shape's nodes from a cursor and skips a whole node (often dozens of stacked
replicas) with one look-up. Part of ``scheduler.planner.spread_repair``.

A one-node shape is also indexed by partner: for each model, the nodes where it
has members, by how many replicas of it run there (``Spread.on_node``, which
the repair keeps up to date and tells the group about through ``recount``). A
swap helps a model without ``spread_by`` only onto a node holding at least two
fewer of it than its own, and a partner without ``spread_by`` agrees only to
leave a node holding more of it than the candidate's node does; so
``partner_keys`` lists just the nodes where both can hold, out of every node of
the shape. On the openb inventory that is 1.6 nodes per candidate (from about
42 filed entries read) where the scan read 267 (phi-3-mini's 1,430 replicas on
G2 nodes), and none at all in a shape holding one model only (no partner is
ever of the same model).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from itertools import islice

from scheduler.planner.fleet.placements import Placement

Shape = tuple[str | None, int, int, int, int]
Key = tuple[str, ...]

# Nodes a shape's scans read per member before its partner index is built (``Group``).
BUILD_AFTER = 2


def shape_of(p: Placement, priority: int) -> Shape:
    """Partners share the shape and the priority: then every node keeps not only its
    use but which priorities hold it, so a replica left unplaced finds no new room
    to preempt in the next round either."""
    return (p.gpu_class, p.gpus_per_node, p.memory_gb_per_node, len(p.nodes), priority)


class Group:
    """New replicas of one shape by the nodes they run on, nodes in name order.

    With ``counts`` (``Spread.on_node``: model -> node -> replicas running, read
    live), a one-node shape may also be indexed by model and count (``partner_keys``),
    once ``build`` is called. The repair builds it only once scans of the shape have read
    ``BUILD_AFTER`` nodes per member (``scanned``, ``size``): building costs about as
    much as reading every member once, so a shape whose candidates find their partner
    in a few reads (the synthetic fleets: 439 reads for 274 candidates at 5,000 nodes)
    never pays for it, and one scanned in full again and again (openb) pays for it once
    and then reads a handful of nodes per candidate.
    """

    __slots__ = (
        "_at",
        "_built",
        "_counts",
        "_keys",
        "_level",
        "_level_of",
        "_models_at",
        "cursor",
        "scanned",
        "size",
    )

    def __init__(self, counts: Mapping[str, Mapping[str, int]] | None = None) -> None:
        self._at: dict[Key, list[int]] = {}
        self._keys: list[Key] = []
        self.cursor: Key = ()
        self._counts = counts
        # Per node: members per model. Per model: its nodes by the count they were filed
        # under, and that count per node (to find the entry again once the count moved).
        self._models_at: dict[Key, dict[str, int]] = {}
        self._level: dict[str, dict[int, set[Key]]] = {}
        self._level_of: dict[str, dict[Key, int]] = {}
        self._built = False
        self.scanned = 0  # nodes read by ``keys_from``
        self.size = 0  # members

    @property
    def indexed(self) -> bool:
        """Whether ``partner_keys`` may be asked (after ``build``)."""
        return self._counts is not None

    @property
    def built(self) -> bool:
        return self._built

    def build(self, model_of: Callable[[int], str]) -> set[str]:
        """Index the members by model and count; the models indexed. Later changes are
        followed by ``add``, ``remove`` and ``recount``."""
        assert self._counts is not None and not self._built
        self._built = True
        for key, members in self._at.items():
            for index in members:
                self._join(key, model_of(index))
        return set(self._level)

    def add(self, nodes: Key, index: int, model: str) -> None:
        members = self._at.get(nodes)
        if members is None:
            members = self._at[nodes] = []
            insort(self._keys, nodes)
        members.append(index)
        self.size += 1
        if self._built:
            self._join(nodes, model)

    def remove(self, nodes: Key, index: int, model: str) -> None:
        members = self._at[nodes]
        members.remove(index)
        self.size -= 1
        if not members:
            del self._at[nodes]
            del self._keys[bisect_left(self._keys, nodes)]
        if not self._built:
            return
        models = self._models_at[nodes]
        models[model] -= 1
        if not models[model]:
            del models[model]
            if not models:
                del self._models_at[nodes]
            self._unfile(model, nodes)

    def recount(self, model: str, node: str) -> None:
        """``model``'s count on ``node`` may have changed: file the node again if indexed."""
        key = (node,)
        filed = self._level_of.get(model)
        if filed is None or key not in filed:
            return
        count = self._count(model, key)
        if count != filed[key]:
            self._unfile(model, key)
            self._file(model, key, count)

    def settle(self, slot: Callable[[int], tuple[str, int]], nodes: Key | None = None) -> None:
        """Members of each node (or of ``nodes`` only) in (model, replica) order."""
        for key in (nodes,) if nodes is not None else self._keys:
            self._at[key].sort(key=slot)

    def members(self) -> Iterator[int]:
        for members in self._at.values():
            yield from members

    def at(self, nodes: Key) -> list[int]:
        return self._at.get(nodes, [])

    def keys_from(self, cursor: Key) -> Iterator[Key]:
        """Every node (tuple) holding members, from the first after ``cursor``, wrapping.

        The group must not change while this is read.
        """
        for key in _wrapping(self._keys, cursor):
            self.scanned += 1
            yield key

    def partner_keys(
        self, model: str, node: str, most: int, plain: Collection[str]
    ) -> Iterator[Key]:
        """The nodes of ``keys_from(self.cursor)`` a swap of ``model``'s replica on ``node``
        could go to, in that order: ``model`` runs at most ``most`` replicas there, and a
        member of another model is there which runs more replicas there than on ``node``
        (for models in ``plain``, whose spread is per node only) or any member (others).

        Only once built. The group must not change while this is read.
        """
        on = self._counts
        assert on is not None and self._built
        own = on.get(model, {})
        found: set[Key] = set()
        for other, levels in self._level.items():
            if other == model:
                continue
            # A partner without spread_by is worse off unless it leaves a node holding
            # more of it than ``node`` does.
            least = on.get(other, {}).get(node, 0) + 1 if other in plain else 0
            for count, keys in levels.items():
                if count >= least:
                    found.update(k for k in keys if own.get(k[0], 0) <= most)
        return _wrapping(sorted(found), self.cursor)

    def _join(self, key: Key, model: str) -> None:
        models = self._models_at.setdefault(key, {})
        models[model] = models.get(model, 0) + 1
        if models[model] == 1:
            self._file(model, key, self._count(model, key))

    def _count(self, model: str, nodes: Key) -> int:
        assert self._counts is not None
        return self._counts.get(model, {}).get(nodes[0], 0)

    def _file(self, model: str, key: Key, count: int) -> None:
        self._level.setdefault(model, {}).setdefault(count, set()).add(key)
        self._level_of.setdefault(model, {})[key] = count

    def _unfile(self, model: str, key: Key) -> None:
        count = self._level_of[model].pop(key)
        levels = self._level[model]
        levels[count].discard(key)
        if not levels[count]:
            del levels[count]
        if not levels:
            del self._level[model]
            del self._level_of[model]


def _wrapping(keys: Sequence[Key], cursor: Key) -> Iterator[Key]:
    start = bisect_right(keys, cursor)
    yield from islice(keys, start, None)
    yield from islice(keys, 0, start)
