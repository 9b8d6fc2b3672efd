"""How well a model is spread, as the spread repair measures it, and what a change does to it.

A model's score is (replicas on nodes without its ``spread_by`` label, sum of
squared replicas per label value, sum of squared replicas per node); without
``spread_by`` only the last counts. Lower is better; the repair makes a change
only when it lowers one model's score and raises none, so it ends. Part of
``scheduler.planner.spread_repair``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement
from scheduler.planner.spread import Spread

# (replicas on unlabelled nodes, sum of squares per label value, sum of squares per node)
Score = tuple[int, int, int]
ZERO: Score = (0, 0, 0)


class Scorer:
    """Reads the round's ``Spread`` (kept and new replicas), which the repair updates."""

    __slots__ = ("_eligible", "inventory", "profiles", "rules", "spread")

    def __init__(
        self,
        spread: Spread,
        rules: Mapping[str, Demand],
        profiles: Mapping[tuple[str, str], PlacementProfile],
        eligible: Callable[[PlacementProfile], Sequence[str]],
    ) -> None:
        self.spread = spread
        self.rules = rules
        self.profiles = profiles
        self.inventory: Mapping[str, Node] = spread.inventory
        self._eligible = eligible

    def crowded(self, p: Placement) -> bool:
        """Whether some change could spread ``p``'s model better (a cheap necessary test)."""
        counts = self.spread.on_node.get(p.model, {})
        if any(counts.get(name, 0) >= 2 for name in p.nodes):
            return True
        label = self.rules[p.model].spread_by
        if label is None:
            return False
        values = [self.value(name, label) for name in p.nodes]
        if any(v is None for v in values):
            return True
        domains = self.spread.in_domain.get(p.model, {})
        profile = self.profiles[(p.model, p.profile)]
        floor = self.spread.floor(p.model, label, self._eligible(profile))
        return any(domains.get(v, 0) >= floor + 2 for v in values if v is not None)

    def delta(self, model: str, old: Sequence[str], new: Sequence[str]) -> Score:
        """How ``model``'s score changes if its replica on ``old`` goes to ``new``."""
        nodes = self.spread.on_node.get(model, {})
        before = {name: nodes.get(name, 0) for name in (*old, *new)}
        after = dict(before)
        for name in old:
            after[name] -= 1
        for name in new:
            after[name] += 1
        node_delta = _squares(after) - _squares(before)
        label = self.rules[model].spread_by
        if label is None:
            return 0, 0, node_delta
        domains = self.spread.in_domain.get(model, {})
        # A replica counts once in each value its nodes span (as ``Spread.add``).
        old_values = {v for n in old if (v := self.value(n, label)) is not None}
        new_values = {v for n in new if (v := self.value(n, label)) is not None}
        was = {v: domains.get(v, 0) for v in old_values | new_values}
        will = {v: c - (v in old_values) + (v in new_values) for v, c in was.items()}
        unlabelled = sum(self.value(n, label) is None for n in new) - sum(
            self.value(n, label) is None for n in old
        )
        return unlabelled, _squares(will) - _squares(was), node_delta

    def ideal(self, a: Placement) -> Score:
        """The best change a swap could make for ``a``'s model: onto nodes holding none of it
        (and, with ``spread_by``, in the least crowded value)."""
        label = self.rules[a.model].spread_by
        if label is not None:
            return (-(1 << 62), -(1 << 62), -(1 << 62))  # no shortcut: scan the shape's replicas
        nodes = self.spread.on_node.get(a.model, {})
        return 0, 0, -sum(2 * (nodes.get(n, 0) - 1) for n in a.nodes)

    def value(self, name: str, label: str) -> str | None:
        node = self.inventory.get(name)
        return None if node is None else node.labels.get(label)


def _squares(counts: Mapping[str, int]) -> int:
    return sum(c * c for c in counts.values())
