"""The placement planner: (demands, inventory, current placements, now) -> plan.

Pure: no I/O, no clock (``now`` is given), no randomness, and no dependence on
the order of ``nodes`` or ``current``. The same inputs give the same plan
(ARCHITECTURE invariant 5), which is what makes a round replayable when
someone asks later why a replica went where it went. ``demands`` order does
matter, on purpose: earlier models are placed first, so catalog order is the
order in which models claim scarce hardware.

A round has two halves:

1. Keep what is valid. Current placements are dropped only with a reason:
   their model or profile is gone, the profile's hardware shape changed, the
   replica is surplus, a node was lost, a node no longer is what the profile
   needs, or a node no longer has room. A running replica is never moved for
   any other reason (invariant 6, stability), so a second round over the
   result with nothing changed keeps everything and does nothing.
2. Place what is missing: per model in ``demands`` order, replica slots
   ascending, each trying the model's profiles from highest priority down;
   the first profile that fits somewhere wins, on its best-fitting node(s).

Cost: O(C + N log N) for C current placements and N nodes when nothing
changed, plus O(L log N) per new single-node replica (see
``scheduler.capacity``), O(F) per multi-node one, and O(N) per profile that
fits nowhere, paid once for the explanation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from catalog.views import PlacementProfile
from scheduler.capacity import Capacity
from scheduler.explain import ProfileRejections, count_rejections, render
from scheduler.fit import gpus_fit, hardware_misfit, memory_fits, selector_key
from scheduler.inventory import Node
from scheduler.placements import Demand, Placement, Plan, Removal, Unplaced
from scheduler.staleness import DEFAULT_STALENESS, Freshness, StalenessPolicy, format_age, freshness


def plan(
    demands: Sequence[Demand],
    nodes: Sequence[Node],
    current: Sequence[Placement],
    now: datetime,
    policy: StalenessPolicy = DEFAULT_STALENESS,
) -> Plan:
    """Decide which replicas to keep, start and stop, and explain what cannot run.

    Raises ValueError for inputs no round can make sense of: a naive ``now``,
    two nodes with one name, or one model demanded twice.
    """
    if now.tzinfo is None:
        raise ValueError(f"now {now} has no time zone; pass the current time in UTC")
    round_ = _Round(_index_demands(demands), _index_nodes(nodes), now)
    state = {name: freshness(n.reported_at, now, policy) for name, n in round_.inventory.items()}
    fresh = frozenset(name for name, f in state.items() if f is Freshness.FRESH)

    valid = round_.keep_valid(current)
    lost = _lost_nodes(valid, state)
    mass_loss = _is_mass_loss(lost, valid, fresh, policy)
    kept = valid if mass_loss else round_.keep_off_lost(valid, lost)
    capacity = Capacity(nodes, fresh)
    kept = round_.keep_what_fits(kept, capacity)
    placed, unplaced = round_.place_missing(demands, kept, capacity, fresh)

    return Plan(
        keep=tuple(sorted(kept, key=_slot_order)),
        place=tuple(sorted(placed, key=_slot_order)),
        # Within a model, highest replica first: the order surplus replicas go in.
        remove=tuple(sorted(round_.removals, key=_removal_order)),
        unplaced=unplaced,
        mass_loss=mass_loss,
        lost_nodes=tuple(sorted(lost)),
    )


@dataclass(slots=True)
class _Round:
    """The state one planning round accumulates: its inputs and the removals so far."""

    demands: dict[str, tuple[int, Demand]]
    inventory: dict[str, Node]
    now: datetime
    removals: list[Removal] = field(default_factory=list)
    # Kept placements re-recorded with a new memory need, mapped to the stored
    # originals, so that a removal names the placement the store actually holds.
    recorded_as: dict[Placement, Placement] = field(default_factory=dict)

    def drop(self, placement: Placement, reason: str) -> None:
        self.removals.append(Removal(self.recorded_as.get(placement, placement), reason))

    def keep_valid(self, current: Sequence[Placement]) -> list[Placement]:
        """Current placements minus those with a reason to go other than node loss or room.

        Sorted first so that which of two duplicates survives does not depend on
        the order the store returned them in.
        """
        kept: list[Placement] = []
        slots: set[tuple[str, int]] = set()
        for placement in sorted(current, key=_full_order):
            slot = (placement.model, placement.replica)
            duplicate = slot in slots
            slots.add(slot)
            profile = self._profile_of(placement)
            reason = self._reason_to_drop(placement, profile, duplicate)
            if reason is not None:
                self.drop(placement, reason)
            elif profile is not None:
                updated = _with_current_memory(placement, profile)
                if updated is not placement:
                    self.recorded_as[updated] = placement
                kept.append(updated)
        return kept

    def keep_off_lost(self, placements: list[Placement], lost: set[str]) -> list[Placement]:
        """The placements that touch no lost node; the others are dropped, naming the node."""
        kept = []
        for placement in placements:
            gone = sorted(name for name in placement.nodes if name in lost)
            if gone:
                self.drop(placement, self._lost_reason(gone[0]))
            else:
                kept.append(placement)
        return kept

    def keep_what_fits(self, kept: list[Placement], capacity: Capacity) -> list[Placement]:
        """Let kept placements consume capacity, dropping any that overcommit a node.

        Taken in catalog order, replicas ascending, so when a node shrank (or
        its reserved cards grew) it is the later replicas there that go.
        """
        fitting = []
        for placement in sorted(kept, key=self._catalog_order):
            reason = _no_room(placement, capacity)
            if reason is None:
                capacity.consume(
                    placement.nodes, placement.gpus_per_node, placement.memory_gb_per_node
                )
                fitting.append(placement)
            else:
                self.drop(placement, reason)
        return fitting

    def place_missing(
        self,
        demands: Sequence[Demand],
        kept: Iterable[Placement],
        capacity: Capacity,
        fresh: frozenset[str],
    ) -> tuple[list[Placement], tuple[Unplaced, ...]]:
        """Fill every empty replica slot that fits, and explain the rest."""
        occupied: dict[str, set[int]] = {}
        for placement in kept:
            occupied.setdefault(placement.model, set()).add(placement.replica)
        # Capacity only shrinks from here on, so a requirement that found no room
        # once will find none for the rest of the round: don't search again.
        no_room: set[_Requirement] = set()
        placed: list[Placement] = []
        failed: list[tuple[str, int, list[PlacementProfile]]] = []
        for demand in demands:
            taken = occupied.get(demand.model, set())
            profiles = _by_priority(demand.profiles)
            for replica in range(max(demand.replicas, 0)):
                if replica in taken:
                    continue
                new = _place_one(demand.model, replica, profiles, capacity, no_room)
                if new is None:
                    failed.append((demand.model, replica, profiles))
                else:
                    placed.append(new)
        return placed, self._explain(failed, capacity, fresh)

    def _explain(
        self,
        failed: list[tuple[str, int, list[PlacementProfile]]],
        capacity: Capacity,
        fresh: frozenset[str],
    ) -> tuple[Unplaced, ...]:
        # Explained against the capacity left at the end of the round: a profile
        # that found no room earlier finds none now either, and "why not now" is
        # the question an operator asks.
        nodes = list(self.inventory.values())
        counted: dict[tuple[str, _Requirement], ProfileRejections] = {}
        unplaced = []
        for model, replica, profiles in failed:
            rejections = []
            for profile in profiles:
                key = (profile.name, _requirement(profile))
                if key not in counted:
                    counted[key] = count_rejections(profile, nodes, fresh=fresh, capacity=capacity)
                rejections.append(counted[key])
            reason = (
                render(rejections) if rejections else "the model has no profiles to place it with"
            )
            unplaced.append(Unplaced(model, replica, reason, tuple(rejections)))
        return tuple(sorted(unplaced, key=lambda u: (u.model, u.replica)))

    def _profile_of(self, placement: Placement) -> PlacementProfile | None:
        entry = self.demands.get(placement.model)
        if entry is None:
            return None
        return next((p for p in entry[1].profiles if p.name == placement.profile), None)

    def _reason_to_drop(
        self, placement: Placement, profile: PlacementProfile | None, duplicate: bool
    ) -> str | None:
        """Why a current placement must go whatever the nodes' health and room, or None."""
        entry = self.demands.get(placement.model)
        if entry is None:
            return "model removed from catalog"
        if duplicate:
            return f"another placement already holds replica {placement.replica}"
        if profile is None:
            return f"profile {placement.profile} removed from the model"
        shape_change = _shape_change(placement, profile)
        if shape_change is not None:
            return shape_change
        desired = max(entry[1].replicas, 0)
        if not 0 <= placement.replica < desired:
            return f"surplus replica (the model wants {desired})"
        for name in sorted(placement.nodes):
            node = self.inventory.get(name)
            # A node missing from the inventory is judged by the loss rules.
            misfit = None if node is None else hardware_misfit(node, profile)
            if misfit is not None:
                return f"node {name} no longer fits: {misfit}"
        return None

    def _lost_reason(self, name: str) -> str:
        node = self.inventory.get(name)
        if node is None:
            return f"node {name} lost (no longer in the inventory)"
        return f"node {name} lost (not heard from for {format_age(self.now - node.reported_at)})"

    def _catalog_order(self, placement: Placement) -> tuple[int, int]:
        return self.demands[placement.model][0], placement.replica


_Requirement = tuple[str | None, tuple[tuple[str, str], ...], int, int, int]


def _requirement(profile: PlacementProfile) -> _Requirement:
    """Everything about a profile that decides where it fits (not its name)."""
    return (
        profile.gpu_class,
        selector_key(profile.node_selector),
        profile.gpus_per_node,
        profile.min_memory_gb,
        profile.nodes,
    )


def _place_one(
    model: str,
    replica: int,
    profiles: list[PlacementProfile],
    capacity: Capacity,
    no_room: set[_Requirement],
) -> Placement | None:
    """Place one replica with the first profile that fits, consuming its capacity."""
    for profile in profiles:
        requirement = _requirement(profile)
        if requirement in no_room:
            continue
        if profile.nodes > 1:
            chosen = capacity.best_gang(profile)
        else:
            best = capacity.best_node(profile)
            chosen = None if best is None else (best,)
        if chosen is None:
            no_room.add(requirement)
            continue
        capacity.consume(chosen, profile.gpus_per_node, profile.min_memory_gb)
        return Placement(
            model=model,
            replica=replica,
            profile=profile.name,
            nodes=chosen,
            gpus_per_node=profile.gpus_per_node,
            gpu_class=profile.gpu_class,
            memory_gb_per_node=profile.min_memory_gb,
        )
    return None


def _no_room(placement: Placement, capacity: Capacity) -> str | None:
    """Why a kept placement no longer fits what is left on its nodes, or None."""
    for name in sorted(placement.nodes):
        if not capacity.knows(name):
            continue
        free_gpus = capacity.free_gpus(name)
        if not gpus_fit(free_gpus, placement.gpus_per_node):
            return (
                f"node {name} no longer has room: needs {placement.gpus_per_node} GPUs, "
                f"{max(free_gpus, 0)} free"
            )
        free_memory = capacity.free_memory(name)
        if not memory_fits(free_memory, placement.memory_gb_per_node):
            return (
                f"node {name} no longer has room: needs {placement.memory_gb_per_node} GB "
                f"memory, {free_memory:g} GB free"
            )
    return None


def _shape_change(placement: Placement, profile: PlacementProfile) -> str | None:
    """A reason if the profile now asks for different hardware than the replica runs on."""
    was = (len(placement.nodes), placement.gpus_per_node, placement.gpu_class)
    now = (profile.nodes, profile.gpus_per_node, profile.gpu_class)
    if was == now and len(set(placement.nodes)) == len(placement.nodes):
        return None
    return f"profile {profile.name} changed shape: was {_shape(*was)}, now {_shape(*now)}"


def _shape(nodes: int, gpus_per_node: int, gpu_class: str | None) -> str:
    per_node = "CPU only" if gpu_class is None else f"{gpus_per_node} {gpu_class}"
    return f"{nodes} node{'s' if nodes != 1 else ''} x {per_node}"


def _with_current_memory(placement: Placement, profile: PlacementProfile) -> Placement:
    # Memory is a need, not part of the hardware shape: a replica whose profile
    # now asks for more memory stays where it is if the node has room, and is
    # accounted at the new figure so the node is not overcommitted.
    if placement.memory_gb_per_node == profile.min_memory_gb:
        return placement
    return replace(placement, memory_gb_per_node=profile.min_memory_gb)


def _by_priority(profiles: Sequence[PlacementProfile]) -> list[PlacementProfile]:
    """Highest priority first; equal priorities keep declaration order (sort is stable)."""
    return sorted(profiles, key=lambda p: -p.priority)


def _index_nodes(nodes: Sequence[Node]) -> dict[str, Node]:
    inventory: dict[str, Node] = {}
    for node in nodes:
        if node.name in inventory:
            raise ValueError(
                f'node "{node.name}" appears twice in the inventory; each node reports once'
            )
        inventory[node.name] = node
    return inventory


def _index_demands(demands: Sequence[Demand]) -> dict[str, tuple[int, Demand]]:
    by_model: dict[str, tuple[int, Demand]] = {}
    for position, demand in enumerate(demands):
        if demand.model in by_model:
            raise ValueError(
                f'model "{demand.model}" is demanded twice; merge its demands into one'
            )
        by_model[demand.model] = (position, demand)
    return by_model


def _lost_nodes(placements: Sequence[Placement], state: dict[str, Freshness]) -> set[str]:
    """Nodes hosting placements that are gone from the inventory or silent beyond grace."""
    return {
        name
        for placement in placements
        for name in placement.nodes
        if state.get(name, Freshness.LOST) is Freshness.LOST
    }


def _is_mass_loss(
    lost: set[str],
    placements: Sequence[Placement],
    fresh: frozenset[str],
    policy: StalenessPolicy,
) -> bool:
    """Whether so many nodes look lost at once that the control plane should doubt itself.

    The fraction is of the nodes that matter to the round: those hosting
    replicas and those able to take new ones. Counting fresh nodes matters for
    two reasons. A control plane that still hears from most of the cluster is
    not the one with the blip, so the loss is real. And new replicas only land
    on fresh nodes, so the fraction does not drop in the next round just
    because replacements were placed: a second round over the result comes to
    the same decision (stability), rather than wiping what the first one kept.
    """
    hosting = {name for placement in placements for name in placement.nodes}
    relevant = len(hosting | fresh)
    return len(lost) > 1 and len(lost) > policy.mass_loss_fraction * relevant


def _removal_order(removal: Removal) -> tuple[str, int, str]:
    return removal.placement.model, -removal.placement.replica, removal.reason


def _slot_order(placement: Placement) -> tuple[str, int]:
    return placement.model, placement.replica


def _full_order(placement: Placement) -> tuple[str, int, str, tuple[str, ...], int, str, int]:
    return (
        placement.model,
        placement.replica,
        placement.profile,
        placement.nodes,
        placement.gpus_per_node,
        placement.gpu_class or "",
        placement.memory_gb_per_node,
    )
