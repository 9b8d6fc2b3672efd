"""Spreading a model's replicas over nodes, and over the values of a label.

Best fit alone puts every replica of a model on the same node when it has
room (both replicas of an embedding model on one L4 node), so one node failure
takes the model down until the grace period ends. Spread is therefore the
first thing a node is chosen by and best fit the second:

- Without ``spread_by``: a node holding no replica of the model while one fits,
  else the one holding fewest.
- With ``spread_by: LABEL``: a node in the label value (domain) holding fewest
  replicas of the model, then the node holding fewest; nodes without the label
  only when no labelled node fits, since losing them is a domain of its own.
- ``spread_required``: a node only in a domain (or, without ``spread_by``, only
  a node) holding no more replicas than the least-loaded one among every node
  the profile may use, room or not (Kubernetes' ``maxSkew: 1``). When the least
  loaded has no room the replica stays unplaced and the refusal says which
  domain is waiting for room.

A gang replica counts once on each of its nodes and once in each domain they
span. Spread decides where *new* replicas go; it is never a reason to move a
running one (the stability rule), so a spread worsened by a failure is repaired
only as replicas are replaced.

Cost: a model's own replicas are the only nodes passed over, so choosing a
node costs O(k) more than best fit for a model on k nodes; with ``spread_by``
the fitting nodes are scanned until the least-loaded domain is reached, O(F)
at worst, and the domains the profile may use are gathered once per round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement, changed_from, same_objects

_UNLABELLED = 1 << 62  # ranks a node without the label after every labelled one


@dataclass(frozen=True, slots=True)
class Choice:
    """A node chosen, or why spread refused every node that fits."""

    node: str | None
    refusal: str | None = None


@dataclass(slots=True)
class Spread:
    """How many replicas of each model are on each node and in each domain."""

    rules: Mapping[str, tuple[str | None, bool]]
    inventory: Mapping[str, Node]
    on_node: dict[str, dict[str, int]] = field(default_factory=dict)
    in_domain: dict[str, dict[str, int]] = field(default_factory=dict)
    # (model, eligible nodes' identity) -> the label values those nodes carry.
    _domains: dict[tuple[str, int], frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        demands: Sequence[Demand],
        inventory: Mapping[str, Node],
        placements: Iterable[Placement],
    ) -> Spread:
        spread = cls({d.model: (d.spread_by, d.spread_required) for d in demands}, inventory)
        for placement in placements:
            spread.add(placement.model, placement.nodes)
        return spread

    def copy(self) -> Spread:
        return Spread(
            self.rules,
            self.inventory,
            {m: dict(c) for m, c in self.on_node.items()},
            {m: dict(c) for m, c in self.in_domain.items()},
            self._domains,
        )

    def matters(self, model: str) -> bool:
        """Whether the model has a required spread (which every way of placing honours)."""
        return self.rules.get(model, (None, False))[1]

    def plain_gang(self, model: str) -> bool:
        """Whether ``choose_gang`` (preferring spread) ranks a node by the model's replicas
        on it alone: no spread label and no required spread."""
        return self.rules.get(model, (None, False)) == (None, False)

    def add(self, model: str, nodes: Sequence[str], delta: int = 1) -> None:
        counts = self.on_node.setdefault(model, {})
        for name in nodes:
            counts[name] = counts.get(name, 0) + delta
        label = self.rules.get(model, (None, False))[0]
        if label is None:
            return
        domains = self.in_domain.setdefault(model, {})
        for value in {v for name in nodes if (v := self._value(name, label)) is not None}:
            domains[value] = domains.get(value, 0) + delta

    def remove(self, model: str, nodes: Sequence[str]) -> None:
        self.add(model, nodes, -1)

    def discard(self, model: str, nodes: Sequence[str]) -> None:
        """``remove``, leaving no count at 0: the counts ``of`` would build without it."""
        self.remove(model, nodes)
        for counts in (self.on_node.get(model, {}), self.in_domain.get(model, {})):
            for key in [k for k, v in counts.items() if v == 0]:
                del counts[key]
        # ``of`` makes a model's counts at its first replica (its domains' even when none
        # of its nodes has the label): they go with its last.
        if not self.on_node.get(model, True):
            del self.on_node[model]
            self.in_domain.pop(model, None)

    def choose(
        self,
        model: str,
        fitting: Iterable[str],
        eligible: Callable[[], Sequence[str]],
        *,
        prefer: bool,
    ) -> Choice:
        """The node to place one replica of ``model`` on, from ``fitting`` in the order preferred.

        ``eligible`` gives every node the profile may use, room or not; it is
        asked only for a required spread. With ``prefer`` False (the baselines
        a round is compared with) only a required spread is applied.
        """
        label, required = self.rules.get(model, (None, False))
        if not required and not prefer:
            return Choice(next(iter(fitting), None))
        key = self._key(model, label)
        floor = self._floor(model, label, eligible) if required else None
        best: tuple[tuple[int, int], str] | None = None
        seen_any = False
        for name in fitting:
            seen_any = True
            rank = key(name)
            if floor is not None and rank[0] > floor:
                continue
            if best is None or rank < best[0]:
                best = (rank, name)
                if rank == (floor or 0, 0):
                    break
        if best is not None:
            return Choice(best[1])
        if not seen_any or floor is None:
            return Choice(None)
        return Choice(None, self._refusal(model, label, floor, eligible))

    def choose_gang(
        self,
        model: str,
        fitting: Sequence[tuple[int, float, str]],
        size: int,
        eligible: Callable[[], Sequence[str]],
        *,
        prefer: bool,
    ) -> Choice | tuple[str, ...]:
        """``size`` nodes of one fabric for a gang replica, spread first, then best fit.

        Returns the nodes, or a ``Choice`` with no node (and a refusal when a
        required spread was what stood in the way).
        """
        label, required = self.rules.get(model, (None, False))
        key = self._key(model, label) if (prefer or required) else (lambda _name: (0, 0))
        floor = self._floor(model, label, eligible) if required else None
        by_fabric: dict[str, list[tuple[tuple[int, int], int, float, str]]] = {}
        for level, memory, name in fitting:
            fabric = self.inventory[name].fabric
            rank = key(name)
            if fabric is None or (floor is not None and rank[0] > floor):
                continue
            by_fabric.setdefault(fabric, []).append((rank, level, memory, name))
        groups = []
        for fabric, entries in by_fabric.items():
            if len(entries) >= size:
                chosen = sorted(entries)[:size]
                spread = tuple(map(sum, zip(*(e[0] for e in chosen), strict=True)))
                groups.append(
                    (spread, sum(e[1] for e in chosen), sum(e[2] for e in chosen), fabric, chosen)
                )
        if groups:
            return tuple(sorted(e[3] for e in min(groups, key=lambda g: g[:4])[4]))
        if floor is not None and fitting:
            return Choice(None, self._refusal(model, label, floor, eligible))
        return Choice(None)

    def floor(self, model: str, label: str | None, names: Sequence[str]) -> int:
        """The fewest replicas of ``model`` on any of ``names`` (with ``label``: in any of
        their values). ``names`` must be the same list object for the same profile."""
        return self._floor(model, label, lambda: names)

    def _key(self, model: str, label: str | None) -> Callable[[str], tuple[int, int]]:
        nodes = self.on_node.get(model, {})
        if label is None:
            return lambda name: (nodes.get(name, 0), 0)
        domains = self.in_domain.get(model, {})

        def rank(name: str) -> tuple[int, int]:
            value = self._value(name, label)
            spread = _UNLABELLED if value is None else domains.get(value, 0)
            return spread, nodes.get(name, 0)

        return rank

    def _floor(self, model: str, label: str | None, eligible: Callable[[], Sequence[str]]) -> int:
        """The fewest replicas of the model on any node (any domain) it may use.

        ``eligible`` must return the same list object for the same profile
        within a round (the planner caches it), so the domains are gathered once.
        """
        names = eligible()
        if label is None:
            nodes = self.on_node.get(model, {})
            return min((nodes.get(n, 0) for n in names), default=0)
        values = self._values(label, names)
        domains = self.in_domain.get(model, {})
        return min((domains.get(v, 0) for v in values), default=_UNLABELLED)

    def _values(self, label: str, names: Sequence[str]) -> frozenset[str]:
        values = self._domains.get((label, id(names)))
        if values is None:
            values = frozenset(v for n in names if (v := self._value(n, label)) is not None)
            self._domains[(label, id(names))] = values
        return values

    def _refusal(
        self, model: str, label: str | None, floor: int, eligible: Callable[[], Sequence[str]]
    ) -> str:
        if label is None:
            return (
                f"spread_required: every node with room already runs a replica of {model} "
                "and nodes running fewer have no room"
            )
        if floor == _UNLABELLED:
            return f"spread_required: no node this profile may use carries label {label}"
        domains = self.in_domain.get(model, {})
        waiting = sorted(v for v in self._values(label, eligible()) if domains.get(v, 0) == floor)
        shown = ", ".join(f"{label}={v}" for v in waiting[:3]) + (
            ", ..." if len(waiting) > 3 else ""
        )
        return (
            f"spread_required: the next replica must go to {shown} ({floor} replica"
            f"{'' if floor == 1 else 's'} there), and no node there has room"
        )

    def _value(self, name: str, label: str) -> str | None:
        node = self.inventory.get(name)
        return None if node is None else node.labels.get(label)


@dataclass(slots=True)
class SpreadMemo:
    """The round before's counts (``Spread.of`` of its kept placements), for a round whose
    kept placements are the same less a few (a node lost): those few taken out of them,
    which gives the counts ``Spread.of`` builds (counts of the same replicas; none left
    at 0), instead of counting every replica again. Held by ``plan``'s ``carried``."""

    inventory: object = None
    demands: list[Demand] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)
    on_node: dict[str, dict[str, int]] = field(default_factory=dict)
    in_domain: dict[str, dict[str, int]] = field(default_factory=dict)
    patched: int = 0

    def of(
        self,
        demands: Sequence[Demand],
        inventory: Mapping[str, Node],
        placements: Sequence[Placement],
        version: object,
    ) -> Spread:
        changes = (
            changed_from(self.placements, placements)
            if version is not None
            and version == self.inventory
            and same_objects(self.demands, demands)
            else None
        )
        if changes is None:
            spread = Spread.of(demands, inventory, placements)
        else:
            spread = Spread(
                {d.model: (d.spread_by, d.spread_required) for d in demands},
                inventory,
                self.on_node,
                self.in_domain,
            )
            removed, added = changes
            for p in removed:
                spread.discard(p.model, p.nodes)
            # The placements a write added (the round after it): counted in (the counts
            # are looked up, never walked in order, so where a new key lands is no matter).
            for p in added:
                spread.add(p.model, p.nodes)
            self.patched += 1
        kept = spread.copy()
        self.inventory, self.demands, self.placements = version, list(demands), list(placements)
        self.on_node, self.in_domain = kept.on_node, kept.in_domain
        return spread
