"""How many failures each model survives, as a number anyone can check.

A model's resilience is the fewest nodes whose loss leaves it no replica
(and, for a model with ``spread_by: LABEL``, the fewest values of that label,
such as zones, whose loss does). Two replicas on one node: 1. Two replicas on
two nodes of one zone: 2 nodes, 1 zone. A gang replica is lost with any one of
its nodes. It is the size of the smallest set of nodes that hits every
replica (a minimum hitting set), which is computed exactly: replicas that share
no node are independent, so the problem splits into small groups, and only
replicas that share nodes (gangs overlapping on a node) need a search. A group
too large to search is given the number of its replicas that share no node
with each other, which is never more than the true figure: the report may
understate resilience, never overstate it.

A node without the label is a domain of its own (losing it loses what is on
it, and no zone contains it). Pure: the planner computes it every round
(``Plan.resilience``) and the CLI for the placements as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import groupby
from operator import attrgetter

from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement, Resilience, same_objects

_model = attrgetter("model")

# Groups of replicas sharing nodes larger than this get the safe lower bound.
_SEARCH_LIMIT = 16


class ResilienceMemo:
    """Each model's resilience of the round before, with what it was computed from: its
    Demand and its placements (the very objects, in order) and, for a model spread by a
    label, the nodes' content (``version``, which the caller moves whenever a node's
    content changes; None: unknown). A round whose model has the same is given the same
    figure (it reads nothing else); any other model is computed again. Owned by the caller
    across rounds (``plan``'s ``carried``); pure values."""

    def __init__(self) -> None:
        self.kept: dict[str, tuple[Demand, list[Placement], object, Resilience]] = {}
        # Models whose figure was taken from the round before (for tests and benchmarks).
        self.reused = 0


def resilience(
    demands: Sequence[Demand],
    placements: Iterable[Placement],
    inventory: Mapping[str, Node],
    *,
    memo: ResilienceMemo | None = None,
    inventory_version: object = None,
) -> tuple[Resilience, ...]:
    """Each demanded model's resilience under ``placements``, in demand order. ``memo``:
    the round before's figures (``ResilienceMemo``), reused where they provably hold."""
    # Grouped by runs of one model (``groupby``, in C): the plan's kept and new placements
    # come in slot order, so some 6,000 runs at 100,000 nodes instead of a step for each of
    # 170,000 placements; each model's list is its placements in the order given, as ever.
    by_model: dict[str, list[Placement]] = {}
    for model, run in groupby(placements, _model):
        mine = by_model.get(model)
        if mine is None:
            by_model[model] = list(run)
        else:
            mine.extend(run)
    kept = {} if memo is None else memo.kept
    now: dict[str, tuple[Demand, list[Placement], object, Resilience]] = {}
    out = []
    for d in demands:
        mine = by_model.get(d.model, [])
        version = None if d.spread_by is None else inventory_version
        before = kept.get(d.model)
        if (
            before is not None
            and before[0] is d
            and same_objects(before[1], mine)
            and (d.spread_by is None or (version is not None and before[2] == version))
        ):
            figure = before[3]
            if memo is not None:
                memo.reused += 1
        else:
            figure = _resilience(d, mine, inventory)
        now[d.model] = (d, mine, version, figure)
        out.append(figure)
    if memo is not None:
        memo.kept = now
    return tuple(out)


def _resilience(d: Demand, mine: list[Placement], inventory: Mapping[str, Node]) -> Resilience:
    nodes = min_hitting_set([frozenset(p.nodes) for p in mine])
    domains = None
    if d.spread_by is not None:
        domains = min_hitting_set(
            [frozenset(_domain(n, d.spread_by, inventory) for n in p.nodes) for p in mine]
        )
    return Resilience(d.model, len(mine), nodes, d.spread_by, domains)


def min_hitting_set(sets: Sequence[frozenset[str]]) -> int:
    """The fewest elements that meet every set (0 for no sets)."""
    unique = set(sets)
    # The usual case, replicas that share no node: one loss each. O(size).
    if sum(map(len, unique)) == len(frozenset().union(*unique)):
        return len(unique)
    distinct = sorted(unique, key=lambda s: (len(s), sorted(s)))
    # A set containing another is hit whenever the smaller one is.
    minimal: list[frozenset[str]] = []
    for s in distinct:
        if not any(m <= s for m in minimal):
            minimal.append(s)
    return sum(_solve(group) for group in _groups(minimal))


def _groups(sets: list[frozenset[str]]) -> list[list[frozenset[str]]]:
    """Sets that share elements, transitively: each group is solved on its own."""
    parent = list(range(len(sets)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, s in enumerate(sets):
        for element in s:
            if element in owner:
                parent[root(i)] = root(owner[element])
            else:
                owner[element] = i
    groups: dict[int, list[frozenset[str]]] = {}
    for i, s in enumerate(sets):
        groups.setdefault(root(i), []).append(s)
    return list(groups.values())


def _solve(sets: list[frozenset[str]]) -> int:
    if len(sets) == 1:
        return 1
    if len(sets) > _SEARCH_LIMIT:
        # Replicas pairwise without a common node each need their own loss.
        chosen: list[frozenset[str]] = []
        for s in sets:
            if all(not (s & c) for c in chosen):
                chosen.append(s)
        return len(chosen)
    best = len(sets)

    def search(left: list[frozenset[str]], used: int) -> None:
        nonlocal best
        if not left:
            best = min(best, used)
            return
        if used + 1 >= best:
            return
        smallest = min(left, key=len)
        for element in sorted(smallest):
            search([s for s in left if element not in s], used + 1)

    search(sets, 0)
    return best


def _domain(name: str, label: str, inventory: Mapping[str, Node]) -> str:
    node = inventory.get(name)
    value = None if node is None else node.labels.get(label)
    # Prefixed so that a node named like a label value is not taken for it.
    return f"node:{name}" if value is None else f"value:{value}"
