"""What the spread repair may not do to a round that leaves replicas unplaced.

A round must stay a fixed point of itself: the next round, with nothing
changed, changes nothing. A move into free room changes where room is, so it
is made only when the room it frees is of no use to any unplaced replica's
profile (class, labels, cards or known memory) and the moved replica is no new
victim for a higher-priority unplaced one. Part of ``scheduler.planner.spread_repair``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.fit import missing_label, selector_key
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement


class Guard:
    __slots__ = ("inventory", "priority", "waiting")

    def __init__(
        self,
        inventory: Mapping[str, Node],
        rules: Mapping[str, Demand],
        unplaced: Mapping[str, Sequence[PlacementProfile]],
    ) -> None:
        self.inventory = inventory
        self.priority = {m: d.priority for m, d in rules.items()}
        # What the unplaced replicas could use, once per distinct need: (class,
        # selector, needs cards, needs memory, priority).
        self.waiting = {
            (
                p.gpu_class,
                selector_key(p.node_selector),
                p.gpus_per_node > 0,
                p.min_memory_gb > 0,
                rules[m].priority,
            )
            for m, profiles in unplaced.items()
            for p in profiles
        }

    def inert(self, p: Placement, target: Sequence[str]) -> bool:
        """Whether moving ``p`` to ``target`` leaves every unplaced replica as unplaceable
        as it is: the room freed is of no use to it, and ``p`` is no new victim for it.

        Otherwise the next round, with nothing changed, would place or preempt what
        this one did not (a round must be a fixed point of itself).
        """
        priority = self.priority[p.model]
        for gpu_class, selector, cards, memory, waiting in self.waiting:
            for name in p.nodes:
                node = self.inventory[name]
                if not _could_use(node, gpu_class, selector):
                    continue
                if (cards and p.gpus_per_node > 0) or (
                    memory and p.memory_gb_per_node > 0 and node.memory_gb is not None
                ):
                    return False
            if waiting > priority and any(
                _could_use(self.inventory[name], gpu_class, selector) for name in target
            ):
                return False
        return True

    def admits(
        self, profile: PlacementProfile, names: Sequence[str], avoid: frozenset[str]
    ) -> bool:
        """Whether a swap partner's ``profile`` may take ``names``.

        Same class and fresh, open nodes already (the partner was placed there this
        round, with the same shape); only the labels and the back-off can differ.
        """
        return all(
            name not in avoid
            and (
                not profile.node_selector
                or missing_label(self.inventory[name].labels, profile.node_selector) is None
            )
            for name in names
        )


def _could_use(node: Node, gpu_class: str | None, selector: tuple[tuple[str, str], ...]) -> bool:
    return (gpu_class is None or node.gpu_class == gpu_class) and all(
        node.labels.get(k) == v for k, v in selector
    )
