"""What is left free on each node during a round, and where a profile fits best.

Finding a node must not cost a scan of the inventory per replica: a round may
place ten thousand replicas on five thousand nodes. So the fresh nodes that
could ever suit a profile (right card type, right labels) are gathered once
into a *pool*, bucketed by free GPUs and sorted by free memory then name
inside each bucket. Best fit is then the first entry at or past
``(gpus needed, memory needed)``: O(L log N) for L distinct free-GPU counts
(a handful), instead of O(N). Consuming capacity moves a node between buckets
of the few pools it belongs to, O(P log N) plus a list shift.

Capacity only ever shrinks while replicas are being placed, which is what
lets the planner remember that a profile found no room and not ask again;
it grows only by an eviction (``release``), after which placing starts over
with an empty memory. A second set of pools, in name order, serves first fit
(``first_node``), the baseline a round compares itself with; it is built only
when a round needs it.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Collection, Iterator, Mapping, Sequence
from operator import attrgetter, itemgetter
from typing import Any

from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.fit import (
    gpu_class_matches,
    gpus_fit,
    memory_fits,
    missing_label,
    selector_key,
)
from scheduler.planner.fleet.inventory import Node

_PoolKey = tuple[str | None, tuple[tuple[str, str], ...]]
_second = itemgetter(1)
_name = attrgetter("name")


class Capacity:
    """Free GPUs and memory per node as placements consume them, with best-fit search."""

    def __init__(self, nodes: Sequence[Node], fresh: Collection[str]) -> None:
        """``nodes`` is the whole inventory (names unique); only ``fresh`` ones get new work."""
        # Sorted by name so that pools, and therefore every tie, are independent
        # of the order the inventory arrived in.
        self._nodes = {node.name: node for node in sorted(nodes, key=_name)}
        self._fresh = fresh
        self._free_gpus = {node.name: node.gpus - node.gpus_reserved for node in nodes}
        self._free_memory = {node.name: node.memory_gb for node in nodes}
        self._pools: dict[_PoolKey, _Pool] = {}
        self._pools_of_node: dict[str, list[_Pool]] = {}
        self._classes: dict[str | None, list[Node]] | None = None
        # Pools in name order, for first fit; built only when a round asks for it.
        self._name_pools: dict[_PoolKey, _NamePool] = {}
        self._name_pools_of_node: dict[str, list[_NamePool]] = {}
        # (pool, GPUs, memory) no fresh node has room for (``may_fit``).
        self._no_fit: set[tuple[_PoolKey, int, int]] = set()
        # Each pool's names in name order (``eligible``): a pool's members never change
        # (consuming moves a node between its buckets), so they are sorted once.
        self._eligible: dict[_PoolKey, tuple[str, ...]] = {}
        # Gangs: per pool and (cards, memory, nodes) need, each fabric's fitting nodes and
        # its best group, kept as capacity is consumed (``_gangs``).
        self._gangs: dict[tuple[_PoolKey, int, int, int], _Gangs] = {}
        # Once settled (``settle``): the pools as they were then, kept across rounds
        # (``PoolMemo``), and the nodes consumed since, by which a pool taken from them
        # is brought up to date.
        self._origin: PoolMemo | None = None
        self._dirty: set[str] = set()

    def copy(self) -> Capacity:
        """The same free capacity, to try another way of placing on: O(N), pools rebuilt lazily."""
        other = Capacity.__new__(Capacity)
        other._nodes = self._nodes
        other._fresh = self._fresh
        other._free_gpus = dict(self._free_gpus)
        other._free_memory = dict(self._free_memory)
        other._pools = {}
        other._pools_of_node = {}
        other._classes = self._classes
        other._name_pools = {}
        other._name_pools_of_node = {}
        other._no_fit = set()
        other._eligible = self._eligible
        other._gangs = {}
        other._origin = self._origin
        other._dirty = set(self._dirty)
        return other

    def settle(self, memo: PoolMemo, version: object) -> None:
        """From now on, build pools from ``memo`` (the pools of the round before's settled
        capacity, patched to this one's by the nodes whose free room or freshness differ)
        rather than by sorting their nodes; ``version`` names the nodes' content (None:
        unknown, the memo starts over). Called before any pool is built."""
        if self._pools or self._name_pools or self._gangs:
            raise ValueError("a capacity is settled before any pool is built")
        memo.advance(
            version,
            frozenset(self._fresh),
            dict(self._free_gpus),
            dict(self._free_memory),
            self._nodes,
        )
        self._origin, self._dirty = memo, set()

    def node(self, name: str) -> Node:
        return self._nodes[name]

    def free_state(self) -> tuple[dict[str, int], dict[str, float | None]]:
        """Every node's free cards and memory, copied (compared whole by a memo)."""
        return dict(self._free_gpus), dict(self._free_memory)

    def set_free_state(self, gpus: dict[str, int], memory: dict[str, float | None]) -> None:
        """Take ``free_state`` as it would be after some consuming, before any pool is built
        (a memo's: ``survivors.KeepMemo``); the dictionaries are the capacity's from now."""
        if self._pools or self._name_pools or self._gangs:
            raise ValueError("free capacity is set only before any pool is built")
        if gpus.keys() != self._free_gpus.keys() or memory.keys() != self._free_memory.keys():
            raise ValueError("free capacity is set for the same nodes only")
        self._free_gpus, self._free_memory = gpus, memory

    def knows(self, name: str) -> bool:
        return name in self._nodes

    def free_gpus(self, name: str) -> int:
        return self._free_gpus[name]

    def free_memory(self, name: str) -> float | None:
        return self._free_memory[name]

    def has_room(self, nodes: Sequence[str], gpus_per_node: int, memory_gb_per_node: int) -> bool:
        """Whether each of ``nodes`` still has this much free; unknown nodes are not judged."""
        return all(
            name not in self._nodes
            or (
                gpus_fit(self._free_gpus[name], gpus_per_node)
                and memory_fits(self._free_memory[name], memory_gb_per_node)
            )
            for name in nodes
        )

    def take(self, nodes: Sequence[str], gpus_per_node: int, memory_gb_per_node: int) -> bool:
        """``consume`` if ``has_room``, in one pass: whether it did.

        Keeping every running replica is most of a round in which nothing
        changed, and happens before any pool is built, when consuming is only
        two dictionary updates per node.
        """
        known, free_gpus, free_memory = self._nodes, self._free_gpus, self._free_memory
        for name in nodes:
            if name in known:
                memory = free_memory[name]
                if not (
                    (gpus_per_node == 0 or free_gpus[name] >= gpus_per_node)
                    and (memory_gb_per_node <= 0 or memory is None or memory >= memory_gb_per_node)
                ):
                    return False
        if self._pools or self._name_pools:
            self.consume(nodes, gpus_per_node, memory_gb_per_node)
            return True
        for name in nodes:
            if name in known:
                if self._origin is not None:
                    self._dirty.add(name)
                free_gpus[name] -= gpus_per_node
                memory = free_memory[name]
                if memory is not None:
                    free_memory[name] = memory - memory_gb_per_node
        return True

    def consume(self, nodes: Sequence[str], gpus_per_node: int, memory_gb_per_node: int) -> None:
        """Take a replica's share from each of its nodes; nodes not in the inventory are skipped."""
        for name in nodes:
            if name not in self._nodes:
                continue
            origin = self._origin
            if origin is None:
                pools = self._pools_of_node.get(name, ())
                name_pools = self._name_pools_of_node.get(name, ())
            else:
                self._dirty.add(name)
                keys = origin.keys_of_node.get(name, ())
                built, named = self._pools, self._name_pools
                pools = [p for k in keys if (p := built.get(k))]
                name_pools = [q for k in keys if (q := named.get(k))]
            before = self._entry(name)
            for pool in pools:
                pool.remove(before)
            for name_pool in name_pools:
                name_pool.remove(before)
            self._free_gpus[name] -= gpus_per_node
            memory = self._free_memory[name]
            if memory is not None:
                self._free_memory[name] = memory - memory_gb_per_node
            after = self._entry(name)
            for pool in pools:
                pool.add(after)
            for name_pool in name_pools:
                name_pool.add(after)
            fabric = None
            for pool in pools:
                # A pool's gang groups (``_gangs_for``) see every change of its nodes.
                if pool.gangs and (fabric := fabric or self._nodes[name].fabric) is not None:
                    for gang in pool.gangs:
                        gang.replace(fabric, before, after)

    def release(self, nodes: Sequence[str], gpus_per_node: int, memory_gb_per_node: int) -> None:
        """Give a replica's share back (an eviction): the inverse of ``consume``."""
        self._no_fit.clear()
        self.consume(nodes, -gpus_per_node, -memory_gb_per_node)

    def fitting(
        self, profile: PlacementProfile, avoid: Collection[str] = ()
    ) -> Iterator[tuple[int, float, str]]:
        """Every fresh node that fits ``profile`` now, best fit first (see ``best_node``).

        ``avoid``: nodes not to use (a model backing off from where it failed).
        """
        wanted = self._pool(profile).fitting(profile.gpus_per_node, profile.min_memory_gb)
        if not avoid:
            return wanted
        return (e for e in wanted if e[2] not in avoid)

    def may_fit(self, profile: PlacementProfile) -> bool:
        """False only if no fresh node has the cards and memory ``profile`` needs, whatever
        its labels: then ``fitting`` and every search would find nothing.

        Costs a scan of the profile's class before its pool exists, instead of
        building the pool (a sort and a bucket per node) only to find it full,
        which is what a round with replicas that fit nowhere did every time.
        """
        key = (profile.gpu_class, selector_key(profile.node_selector))
        if key in self._pools:
            return True
        need = (key, profile.gpus_per_node, profile.min_memory_gb)
        if need in self._no_fit:
            return False
        candidates = (
            self._nodes.values()
            if profile.gpu_class is None
            else self._by_class().get(profile.gpu_class, ())
        )
        gpus, memory_gb = profile.gpus_per_node, profile.min_memory_gb
        fresh, free_gpus, free_memory = self._fresh, self._free_gpus, self._free_memory
        for node in candidates:
            name = node.name
            if (
                name in fresh
                and (gpus == 0 or free_gpus[name] >= gpus)
                and memory_fits(free_memory[name], memory_gb)
            ):
                return True
        # Capacity only shrinks until something is released, which forgets this.
        self._no_fit.add(need)
        return False

    def eligible(self, profile: PlacementProfile) -> list[str]:
        """The fresh nodes of the profile's class and labels, room or not, by name."""
        return list(self.eligible_names(profile))

    def eligible_names(self, profile: PlacementProfile) -> tuple[str, ...]:
        """``eligible``, shared rather than copied: sorted once per pool (not per search,
        which made a round's defragmentation O(N log N) per unplaced profile)."""
        key: _PoolKey = (profile.gpu_class, selector_key(profile.node_selector))
        names = self._eligible.get(key)
        if names is None:
            if self._origin is not None:
                self._pool(profile)
                names = self._origin.eligible_names(key)
            else:
                names = tuple(sorted(self._pool(profile).names()))
            self._eligible[key] = names
        return names

    def first_node(self, profile: PlacementProfile, avoid: Collection[str] = ()) -> str | None:
        """The fitting node first by name: first fit, the baseline a round must not fall below.

        ``avoid``: nodes not to use, as for ``best_node``.
        """
        return self._name_pool(profile).first(
            profile.gpus_per_node, profile.min_memory_gb, self._free_memory, avoid
        )

    def first_gang(
        self, profile: PlacementProfile, avoid: Collection[str] = ()
    ) -> tuple[str, ...] | None:
        """The first fabric, in name order of its nodes, to have ``profile.nodes`` that fit:
        the fabric whose ``profile.nodes``-th fitting node by name comes first, with those
        nodes. Read from the fabrics' kept groups (``_gangs``): O(log F), not a sort of
        every fitting node per gang (which made a round from nothing O(N^2) in gangs)."""
        return self._gangs_for(profile).first(avoid, self._nodes)

    def best_node(self, profile: PlacementProfile, avoid: Collection[str] = ()) -> str | None:
        """The fitting node with the fewest free GPUs, then least free memory, then name.

        ``avoid``: nodes not to use (a model backing off from where it failed).
        """
        wanted = self._pool(profile).fitting(profile.gpus_per_node, profile.min_memory_gb)
        entry = next((e for e in wanted if e[2] not in avoid), None)
        return None if entry is None else entry[2]

    def best_gang(
        self, profile: PlacementProfile, avoid: Collection[str] = ()
    ) -> tuple[str, ...] | None:
        """``profile.nodes`` distinct fitting nodes on one fabric, chosen by best fit.

        Within each fabric the best-fitting nodes are taken; among fabrics that
        have enough, the one leaving the fewest GPUs (then memory) idle on the
        chosen nodes wins, ties broken by fabric name. O(log F) for F fabrics: each
        fabric's group is kept as capacity is consumed (``_gangs``), and only the
        fabrics of ``avoid`` are looked at again.
        """
        return self.ranked_gang(profile, avoid, {})

    def ranked_gang(
        self, profile: PlacementProfile, avoid: Collection[str], ranks: Mapping[str, int]
    ) -> tuple[str, ...] | None:
        """``best_gang`` with a rank per node taken first (``Spread.choose_gang`` without a
        spread label or a required spread: a node's rank is how many of the model's
        replicas it runs): per fabric the ``profile.nodes`` least by (rank, free GPUs,
        free memory, name), and the fabric least by (their rank, GPUs, memory, name).
        A node of rank 0 is every node but the model's own, so only the fabrics of the
        model's nodes (and of ``avoid``) are looked at again."""
        return self._gangs_for(profile).best(avoid, ranks, self._nodes)

    def _gangs_for(self, profile: PlacementProfile) -> _Gangs:
        """The pool's fabrics and their groups for this gang need, built on first use."""
        pool_key: _PoolKey = (profile.gpu_class, selector_key(profile.node_selector))
        key = (pool_key, profile.gpus_per_node, profile.min_memory_gb, profile.nodes)
        gangs = self._gangs.get(key)
        if gangs is None:
            gangs = self._gangs[key] = _Gangs(
                profile.gpus_per_node, profile.min_memory_gb, profile.nodes
            )
            # Only the nodes that fit now: the others are known to the groups when a
            # change makes them fit (the pool tells its groups of every change).
            pool = self._pool(profile)
            nodes = self._nodes
            for entry in pool.fitting(profile.gpus_per_node, profile.min_memory_gb):
                fabric = nodes[entry[2]].fabric
                if fabric is not None:
                    gangs.add(fabric, entry)
            gangs.settle()
            pool.gangs.append(gangs)
        return gangs

    def _by_class(self) -> dict[str | None, list[Node]]:
        """The nodes grouped by GPU class, in name order; built on first use."""
        if self._classes is None:
            self._classes = {}
            for node in self._nodes.values():
                self._classes.setdefault(node.gpu_class, []).append(node)
        return self._classes

    def _entry(self, name: str) -> tuple[int, float, str]:
        # Free GPUs below zero (over-reserved outside our control) still allow a
        # CPU replica, which needs none; clamping keeps such nodes in bucket 0.
        memory = self._free_memory[name]
        return (
            max(self._free_gpus[name], 0),
            math.inf if memory is None else memory,
            name,
        )

    def _from_origin(self, origin: PoolMemo, key: _PoolKey, profile: PlacementProfile) -> _Pool:
        """The pool as the settled capacity had it (``PoolMemo``), brought up to date by
        the nodes consumed since: the same buckets as sorting its nodes now, since a pool
        is its members' entries in order, whatever way they were put there."""
        base = origin.pool(key, profile, self._by_class())
        members = origin.members[key]
        dirty = self._dirty & members if len(self._dirty) < len(members) else members & self._dirty
        if len(dirty) * origin.rebuild_share > len(members):
            # Most of it consumed since (a round placing much): sorted afresh.
            pool = _Pool()
            pool.fill(sorted(self._entry(name) for name in members))
            return pool
        pool = base.copy()
        for name in dirty:
            pool.remove(origin.entry(name))
            pool.add(self._entry(name))
        return pool

    def _name_pool_from_origin(self, origin: PoolMemo, key: _PoolKey) -> _NamePool:
        """``_from_origin`` for first fit's pool in name order."""
        base = origin.name_pool(key)
        members = origin.members[key]
        dirty = self._dirty & members if len(self._dirty) < len(members) else members & self._dirty
        if len(dirty) * origin.rebuild_share > len(members):
            pool = _NamePool()
            pool.fill(sorted(self._entry(name)[::2] for name in members))
            return pool
        pool = base.copy()
        for name in dirty:
            pool.remove(origin.entry(name))
            pool.add(self._entry(name))
        return pool

    def _name_pool(self, profile: PlacementProfile) -> _NamePool:
        key: _PoolKey = (profile.gpu_class, selector_key(profile.node_selector))
        pool = self._name_pools.get(key)
        if pool is None and self._origin is not None:
            self._pool(profile)  # the origin's members for this key
            pool = self._name_pools[key] = self._name_pool_from_origin(self._origin, key)
        if pool is None:
            pool = self._name_pools[key] = _NamePool()
            # Each level's names sorted once: the same buckets as adding them one by one,
            # without an insertion (a list shift) per node.
            source = self._pool(profile)
            pool.take_levels(source)
            names = list(source.names())
            name_pools_of_node = self._name_pools_of_node
            for name in names:
                name_pools_of_node.setdefault(name, []).append(pool)
        return pool

    def _pool(self, profile: PlacementProfile) -> _Pool:
        """The fresh nodes of the right class and labels, built on first use: O(N log N)."""
        key: _PoolKey = (profile.gpu_class, selector_key(profile.node_selector))
        pool = self._pools.get(key)
        if pool is None and self._origin is not None:
            pool = self._pools[key] = self._from_origin(self._origin, key, profile)
        if pool is None:
            pool = _Pool()
            # A GPU profile can only use nodes of its class: look at those alone.
            candidates = (
                self._nodes.values()
                if profile.gpu_class is None
                else self._by_class().get(profile.gpu_class, ())
            )
            fresh, selector = self._fresh, profile.node_selector
            entries = [
                self._entry(node.name)
                for node in candidates
                if node.name in fresh
                and gpu_class_matches(node.gpu_class, profile)
                and (not selector or missing_label(node.labels, selector) is None)
            ]
            # Sorted once and bucketed in order: the same pool as adding them one
            # by one, without an insertion into a sorted list per node.
            pool.fill(sorted(entries))
            pools_of_node = self._pools_of_node
            for entry in entries:
                pools_of_node.setdefault(entry[2], []).append(pool)
            self._pools[key] = pool
        return pool


class _Pool:
    """Nodes bucketed by free GPUs; each bucket sorted by (free memory, name)."""

    __slots__ = ("_buckets", "_levels", "gangs")

    def __init__(self) -> None:
        # The gang groups kept over this pool's nodes (``Capacity._gangs_for``).
        self.gangs: list[_Gangs] = []
        self._buckets: dict[int, list[tuple[float, str]]] = {}
        self._levels: list[int] = []  # sorted free-GPU counts with a non-empty bucket

    def add(self, entry: tuple[int, float, str]) -> None:
        level, memory, name = entry
        bucket = self._buckets.get(level)
        if bucket is None:
            bucket = self._buckets[level] = []
            insort(self._levels, level)
        insort(bucket, (memory, name))

    def buckets(self) -> Mapping[int, list[tuple[float, str]]]:
        return self._buckets

    def levels(self) -> Sequence[int]:
        return self._levels

    def copy(self) -> _Pool:
        other = _Pool()
        other._buckets = {level: list(bucket) for level, bucket in self._buckets.items()}
        other._levels = list(self._levels)
        return other

    def fill(self, entries: list[tuple[int, float, str]]) -> None:
        """Add ``entries``, sorted, to an empty pool."""
        for level, memory, name in entries:
            bucket = self._buckets.get(level)
            if bucket is None:
                bucket = self._buckets[level] = []
                self._levels.append(level)
            bucket.append((memory, name))

    def remove(self, entry: tuple[int, float, str]) -> None:
        level, memory, name = entry
        bucket = self._buckets[level]
        del bucket[bisect_left(bucket, (memory, name))]
        if not bucket:
            del self._buckets[level]
            self._levels.remove(level)

    def names(self) -> Iterator[str]:
        for bucket in self._buckets.values():
            for _, name in bucket:
                yield name

    def fitting(self, gpus: int, memory_gb: int) -> Iterator[tuple[int, float, str]]:
        """Nodes with at least ``gpus`` free GPUs and ``memory_gb`` free memory, best fit first.

        Must not be consumed across a change to the pool.
        """
        floor = (float(max(memory_gb, 0)), "")
        for level in self._levels[bisect_left(self._levels, gpus) :]:
            bucket = self._buckets[level]
            for index in range(bisect_left(bucket, floor), len(bucket)):
                memory, name = bucket[index]
                yield level, memory, name


class _NamePool:
    """Nodes bucketed by free GPUs; each bucket sorted by name (first fit)."""

    __slots__ = ("_buckets", "_levels")

    def __init__(self) -> None:
        self._buckets: dict[int, list[str]] = {}
        self._levels: list[int] = []

    def add(self, entry: tuple[int, float, str]) -> None:
        level, _, name = entry
        bucket = self._buckets.get(level)
        if bucket is None:
            bucket = self._buckets[level] = []
            insort(self._levels, level)
        insort(bucket, name)

    def copy(self) -> _NamePool:
        other = _NamePool()
        other._buckets = {level: list(bucket) for level, bucket in self._buckets.items()}
        other._levels = list(self._levels)
        return other

    def take_levels(self, pool: _Pool) -> None:
        """Fill an empty pool with ``pool``'s nodes: each of its levels' names sorted (in C),
        the buckets adding them one by one would give."""
        self._buckets = {
            level: sorted(map(_second, bucket)) for level, bucket in pool.buckets().items()
        }
        self._levels = list(pool.levels())

    def fill(self, entries: list[tuple[int, str]]) -> None:
        """Add ``entries`` (free-GPU level, name), sorted, to an empty pool."""
        for level, name in entries:
            bucket = self._buckets.get(level)
            if bucket is None:
                bucket = self._buckets[level] = []
                self._levels.append(level)
            bucket.append(name)

    def remove(self, entry: tuple[int, float, str]) -> None:
        level, _, name = entry
        bucket = self._buckets[level]
        del bucket[bisect_left(bucket, name)]
        if not bucket:
            del self._buckets[level]
            self._levels.remove(level)

    def first(
        self,
        gpus: int,
        memory_gb: int,
        free_memory: dict[str, float | None],
        avoid: Collection[str] = (),
    ) -> str | None:
        """The first node by name with the GPUs and memory: the first per level, then the least.

        A node short of memory is passed over within its level, so this costs a
        few steps per level unless memory is the scarce resource.
        """
        best: str | None = None
        for level in self._levels[bisect_left(self._levels, gpus) :]:
            for name in self._buckets[level]:
                if best is not None and name >= best:
                    break
                if name not in avoid and memory_fits(free_memory[name], memory_gb):
                    best = name
                    break
        return best


_GangKey = tuple[tuple[int, int], int, float, str]


class _Gangs:
    """One pool's fabrics for one gang need (cards, memory, ``size`` nodes): each fabric's
    fitting nodes in best-fit order (free GPUs, free memory, name), and the fabrics with
    ``size`` of them in two heaps, by best fit (their GPUs, memory, fabric) and by first
    fit (their ``size``-th name). Consuming a node re-ranks its fabric alone; stale heap
    entries are dropped when met (their key no longer the fabric's)."""

    __slots__ = ("_best", "_first", "_floor", "_gpus", "_size", "best_key", "fabrics", "first_key")

    def __init__(self, gpus: int, memory_gb: int, size: int) -> None:
        self._gpus, self._floor, self._size = gpus, float(max(memory_gb, 0)), size
        self.fabrics: dict[str, list[tuple[int, float, str]]] = {}
        self.best_key: dict[str, _GangKey] = {}
        self.first_key: dict[str, str] = {}
        self._best: list[_GangKey] = []
        self._first: list[tuple[str, str]] = []

    def _fits(self, entry: tuple[int, float, str]) -> bool:
        # ``_Pool.fitting``'s test: at least the cards (by free-GPU level), and memory.
        return entry[0] >= self._gpus and entry[1] >= self._floor

    def add(self, fabric: str, entry: tuple[int, float, str]) -> None:
        """While building (then ``settle``): one pool member."""
        if self._fits(entry):
            self.fabrics.setdefault(fabric, []).append(entry)

    def settle(self) -> None:
        for fabric, entries in self.fabrics.items():
            entries.sort()
            self._rekey(fabric, entries, push=False)
        heapq.heapify(self._best)
        heapq.heapify(self._first)

    def replace(
        self, fabric: str, before: tuple[int, float, str], after: tuple[int, float, str]
    ) -> None:
        entries = self.fabrics.setdefault(fabric, [])
        if self._fits(before):
            del entries[bisect_left(entries, before)]
        if self._fits(after):
            insort(entries, after)
        self._rekey(fabric, entries, push=True)

    def _rekey(self, fabric: str, entries: list[tuple[int, float, str]], *, push: bool) -> None:
        size = self._size
        if len(entries) < size:
            self.best_key.pop(fabric, None)
            self.first_key.pop(fabric, None)
            return
        chosen = entries[:size]
        best = ((0, 0), sum(e[0] for e in chosen), sum(e[1] for e in chosen), fabric)
        first = sorted(e[2] for e in entries)[size - 1]
        if self.best_key.get(fabric) != best:
            self.best_key[fabric] = best
            if push:
                heapq.heappush(self._best, best)
            else:
                self._best.append(best)
        if self.first_key.get(fabric) != first:
            self.first_key[fabric] = first
            if push:
                heapq.heappush(self._first, (first, fabric))
            else:
                self._first.append((first, fabric))

    def best(
        self, avoid: Collection[str], ranks: Mapping[str, int], nodes: Mapping[str, Node]
    ) -> tuple[str, ...] | None:
        """The least group by (rank, GPUs, memory, fabric): the fabrics holding a node of
        ``avoid`` or of rank above 0 ranked again here, every other from its heap."""
        again = {
            fabric
            for name in (*avoid, *(n for n, r in ranks.items() if r))
            if (node := nodes.get(name)) is not None
            and (fabric := node.fabric) is not None
            and fabric in self.fabrics
        }
        found: tuple[_GangKey, tuple[str, ...]] | None = None
        for fabric in again:
            ranked = sorted(
                (ranks.get(e[2], 0), *e) for e in self.fabrics[fabric] if e[2] not in avoid
            )[: self._size]
            if len(ranked) < self._size:
                continue
            key = (
                (sum(e[0] for e in ranked), 0),
                sum(e[1] for e in ranked),
                sum(e[2] for e in ranked),
                fabric,
            )
            if found is None or key < found[0]:
                found = (key, tuple(e[3] for e in ranked))
        top = self._least(self._best, self.best_key, again)
        if top is not None and (found is None or top < found[0]):
            fabric = top[3]
            found = (top, tuple(e[2] for e in self.fabrics[fabric][: self._size]))
        return None if found is None else tuple(sorted(found[1]))

    def first(self, avoid: Collection[str], nodes: Mapping[str, Node]) -> tuple[str, ...] | None:
        """The group whose ``size``-th fitting name comes first (``first_gang``)."""
        again = {
            fabric
            for name in avoid
            if (node := nodes.get(name)) is not None
            and (fabric := node.fabric) is not None
            and fabric in self.fabrics
        }
        found: tuple[str, tuple[str, ...]] | None = None
        for fabric in again:
            names = sorted(e[2] for e in self.fabrics[fabric] if e[2] not in avoid)
            if len(names) >= self._size:
                group = tuple(names[: self._size])
                if found is None or group[-1] < found[0]:
                    found = (group[-1], group)
        top = self._least(self._first, self.first_key, again, first=True)
        if top is not None and (found is None or top[0] < found[0]):
            names = sorted(e[2] for e in self.fabrics[top[1]])
            found = (top[0], tuple(names[: self._size]))
        return None if found is None else found[1]

    @staticmethod
    def _least(
        heap: list[Any], keys: Mapping[str, Any], skip: Collection[str], *, first: bool = False
    ) -> Any:
        """The heap's least live entry whose fabric is not in ``skip`` (left in the heap)."""
        aside = []
        top = None
        while heap:
            entry = heap[0]
            fabric = entry[1] if first else entry[3]
            live = (keys.get(fabric) == entry[0]) if first else (keys.get(fabric) == entry)
            if not live:
                heapq.heappop(heap)
                continue
            if fabric in skip:
                aside.append(heapq.heappop(heap))
                continue
            top = entry
            break
        for entry in aside:
            heapq.heappush(heap, entry)
        return top


class PoolMemo:
    """The pools of a settled capacity (``Capacity.settle``: the round's, as keeping left
    it, before anything new is placed), kept from round to round and patched by the
    nodes whose free room or freshness changed, instead of sorting every pool's nodes
    again each round: a pool is its members' entries (free GPUs, free memory, name) in
    order, so removing a node's old entry and adding its new one gives the very pool a
    sort gives. Starts over when the nodes' content may have changed (``version``).

    Pure: values only; the caller (``plan``'s ``carried``) owns it."""

    def __init__(self) -> None:
        self.version: object = None
        self.fresh: frozenset[str] | None = None
        self.gpus: dict[str, int] = {}
        self.memory: dict[str, float | None] = {}
        self.pools: dict[_PoolKey, _Pool] = {}
        # First fit's pools in name order, of the same members, built when first asked.
        self.name_pools: dict[_PoolKey, _NamePool] = {}
        self.members: dict[_PoolKey, set[str]] = {}
        self.profiles: dict[_PoolKey, PlacementProfile] = {}
        self.keys_of_node: dict[str, list[_PoolKey]] = {}
        self._eligible: dict[_PoolKey, tuple[str, ...]] = {}
        self._nodes: Mapping[str, Node] = {}
        # Pools patched rather than built (for tests and benchmarks).
        self.patched = 0
        # A pool most of whose nodes were consumed since the capacity settled (more than
        # one in this many) is sorted afresh rather than patched node by node.
        self.rebuild_share = 8

    def entry(self, name: str) -> tuple[int, float, str]:
        """A node's pool entry as the settled capacity had it (``Capacity._entry``)."""
        memory = self.memory[name]
        return (max(self.gpus[name], 0), math.inf if memory is None else memory, name)

    def advance(
        self,
        version: object,
        fresh: frozenset[str],
        gpus: dict[str, int],
        memory: dict[str, float | None],
        nodes: Mapping[str, Node],
    ) -> None:
        """Bring every kept pool to a new settled capacity."""
        if version is None or version != self.version or self.fresh is None:
            self.pools, self.members, self.profiles = {}, {}, {}
            self.keys_of_node, self._eligible, self.name_pools = {}, {}, {}
        else:
            moved = {k for k, _ in gpus.items() ^ self.gpus.items()}
            moved.update(k for k, _ in memory.items() ^ self.memory.items())
            turned = fresh ^ self.fresh
            for key, pool in self.pools.items():
                members, profile = self.members[key], self.profiles[key]
                named = self.name_pools.get(key)
                both: tuple[_Pool | _NamePool, ...] = (pool,) if named is None else (pool, named)
                for name in turned:
                    now_in = name in fresh and _eligible_node(nodes[name], profile)
                    if name in members:
                        for each in both:
                            each.remove(self.entry(name))
                        members.discard(name)
                        self.keys_of_node[name].remove(key)
                        self._eligible.pop(key, None)
                    if now_in:
                        members.add(name)
                        self.keys_of_node.setdefault(name, []).append(key)
                        self._eligible.pop(key, None)
                        for each in both:
                            each.add(_entry_of(name, gpus, memory))
                for name in moved:
                    if name in members and name not in turned:
                        for each in both:
                            each.remove(self.entry(name))
                            each.add(_entry_of(name, gpus, memory))
                self.patched += 1
        self.version, self.fresh, self.gpus, self.memory = version, fresh, gpus, memory
        self._nodes = nodes

    def pool(
        self, key: _PoolKey, profile: PlacementProfile, by_class: Mapping[str | None, list[Node]]
    ) -> _Pool:
        """The settled pool of ``key``, sorted from its nodes the first time."""
        pool = self.pools.get(key)
        if pool is None:
            fresh = self.fresh or frozenset()
            candidates = (
                self._nodes.values()
                if profile.gpu_class is None
                else by_class.get(profile.gpu_class, ())
            )
            # ``_eligible_node`` of each candidate, inline, its class already the profile's
            # (a CPU profile's pool asks every node: 100,000 calls at 100,000 nodes).
            selector = tuple(profile.node_selector.items())
            if selector:
                names = [
                    n.name
                    for n in candidates
                    if n.name in fresh and all(n.labels.get(k) == v for k, v in selector)
                ]
            else:
                names = [n.name for n in candidates if n.name in fresh]
            pool = self.pools[key] = _Pool()
            gpus, memory = self.gpus, self.memory
            pool.fill(
                sorted(
                    (max(gpus[name], 0), math.inf if (free := memory[name]) is None else free, name)
                    for name in names
                )
            )
            self.members[key] = set(names)
            self.profiles[key] = profile
            for name in names:
                self.keys_of_node.setdefault(name, []).append(key)
        return pool

    def name_pool(self, key: _PoolKey) -> _NamePool:
        """The settled pool of ``key`` in name order (``pool`` built first)."""
        named = self.name_pools.get(key)
        if named is None:
            named = self.name_pools[key] = _NamePool()
            named.take_levels(self.pools[key])
        return named

    def eligible_names(self, key: _PoolKey) -> tuple[str, ...]:
        names = self._eligible.get(key)
        if names is None:
            names = self._eligible[key] = tuple(sorted(self.members[key]))
        return names


def _entry_of(
    name: str, gpus: Mapping[str, int], memory: Mapping[str, float | None]
) -> tuple[int, float, str]:
    free = memory[name]
    return (max(gpus[name], 0), math.inf if free is None else free, name)


def _eligible_node(node: Node, profile: PlacementProfile) -> bool:
    """Whether a fresh node belongs to the profile's pool (``Capacity._pool``'s test)."""
    selector = profile.node_selector
    return (profile.gpu_class is None or node.gpu_class == profile.gpu_class) and (
        gpu_class_matches(node.gpu_class, profile)
        and (not selector or missing_label(node.labels, selector) is None)
    )
