"""Which current placements survive a round, and why the others go.

A running replica is never moved without a reason (ARCHITECTURE invariant 6):
its model or profile is gone, the profile's hardware shape changed, the
replica is surplus, a node is lost, a node no longer is what the profile
needs, or a node no longer has room. Each removal says which.

Cost: O(C log C) for C current placements, with a handful of dictionary
look-ups each; this is the whole of a round in which nothing changed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from datetime import datetime
from operator import attrgetter, is_

from catalog.definition.views import PlacementProfile
from scheduler.lifecycle.staleness import Freshness, StalenessPolicy, format_age
from scheduler.planner.fleet.capacity import Capacity
from scheduler.planner.fleet.fit import gpus_fit, hardware_misfit, memory_fits, missing_label
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import (
    Demand,
    Placement,
    Removal,
    changed_from,
    same_objects,
)


@dataclass(frozen=True, slots=True)
class Kept:
    """The outcome of the keeping half of a round.

    ``placements`` have consumed their share of the capacity they were given.
    ``lost_nodes`` host valid placements and are gone or silent beyond grace.
    """

    placements: list[Placement]
    removals: list[Removal]
    mass_loss: bool
    lost_nodes: frozenset[str]


@dataclass(slots=True)
class KeepMemo:
    """What keeping the current placements found in one round, for the next to start from.

    Owned by the caller across rounds (``plan``'s ``memo``; ``IncrementalRounds`` keeps
    one). Reused only where the next round's inputs to that part are the same, so the
    kept placements, removals and free capacity are exactly those a round without it
    computes:

    - ``keep_valid`` reads the placements, the demands and each placement's nodes'
      class and labels: reused when the placements and demands are the same objects in
      the same order and ``inventory`` (a version the caller moves whenever a node's
      content changes) is the same;
    - taking every valid placement, in catalog order, from the capacity the round
      starts with (``start``: its free cards and memory, compared whole) either fits
      them all (``all_fit``, leaving ``free``) or not. When all fit, a subset of them
      taken in the same order fits too (each meets no more consumption than it did),
      and leaves every node no placement left untouched as ``free`` has it; a node some
      dropped placement ran on is counted again from ``start`` over what stays there,
      in the same order, so even its float memory is the same figure.
    """

    inventory: object = None
    current: list[Placement] = field(default_factory=list)
    demands: list[Demand] = field(default_factory=list)
    valid: list[Placement] = field(default_factory=list)
    removals: list[Removal] = field(default_factory=list)
    recorded_as: dict[Placement, Placement] = field(default_factory=dict)
    hosting: frozenset[str] = frozenset()
    # Every valid placement taken from ``start``: whether all fit and what was free after.
    start: tuple[dict[str, int], dict[str, float | None]] | None = None
    all_fit: bool = False
    free: tuple[dict[str, int], dict[str, float | None]] | None = None
    # ``valid`` in catalog order, and each one's nodes.
    ordered: list[Placement] | None = None
    nodes_of: list[tuple[str, ...]] | None = None
    # Rounds that kept from the memo rather than taking every placement again.
    hits: int = 0
    # Rounds whose judgement was patched from the memo's (placements gone and added).
    patched: int = 0


def keep_current(
    current: Sequence[Placement],
    *,
    demands: Sequence[Demand],
    inventory: Mapping[str, Node],
    state: Mapping[str, Freshness],
    capacity: Capacity,
    now: datetime,
    policy: StalenessPolicy,
    memo: KeepMemo | None = None,
    inventory_version: object = None,
    fresh: frozenset[str] | None = None,
) -> Kept:
    """Keep every current placement that has no reason to go, consuming its capacity.

    ``memo``: the round before's work (``KeepMemo``), reused where it provably holds and
    updated with this round's; ``inventory_version`` names the nodes' content (None:
    unknown, the placements are judged again). ``fresh``: the nodes ``state`` says are
    fresh, if the caller has them."""
    keeper = _Keeper(demands, inventory, now)
    same = memo is not None and _same_judging(memo, current, demands, inventory_version)
    patched = (
        None
        if memo is None or same
        else _patched_judging(memo, current, demands, inventory_version, keeper)
    )
    if memo is not None and same:
        valid = list(memo.valid)
        keeper.removals = list(memo.removals)
        keeper.recorded_as = memo.recorded_as
        hosting = set(memo.hosting)
    elif memo is not None and patched is not None:
        valid = patched
        hosting = {name for placement in valid for name in placement.nodes}
        memo.current = list(current)
        memo.valid, memo.removals = list(valid), list(keeper.removals)
        memo.recorded_as, memo.hosting = keeper.recorded_as, frozenset(hosting)
        memo.start = memo.free = memo.ordered = memo.nodes_of = None
        memo.patched += 1
    else:
        valid = keeper.keep_valid(current)
        hosting = {name for placement in valid for name in placement.nodes}
        if memo is not None:
            memo.inventory, memo.current, memo.demands = (
                inventory_version,
                list(current),
                list(demands),
            )
            memo.valid, memo.removals = list(valid), list(keeper.removals)
            memo.recorded_as, memo.hosting = keeper.recorded_as, frozenset(hosting)
            memo.start = memo.free = memo.ordered = memo.nodes_of = None
    if fresh is None:
        fresh = frozenset(name for name, f in state.items() if f is Freshness.FRESH)
    # A fresh node is not lost: only the others hosting a replica are asked (few).
    lost = frozenset(
        name
        for name in hosting.difference(fresh)
        if state.get(name, Freshness.LOST) is Freshness.LOST
    )
    start = capacity.free_state()
    known = memo is not None and memo.start is not None and memo.start == start
    if lost:
        # Judged on the nodes whose placements would still be held: a replica
        # dropped for room stops counting in the next round, which would then
        # come to another decision and remove what this one held.
        if known and memo is not None and memo.all_fit:
            hosting = set(memo.hosting)  # every valid placement fits: each node hosts
        else:
            hosting = keeper.hosts_of_what_fits(valid, capacity, memo)
    mass_loss = _is_mass_loss(len(lost & hosting), len(hosting | fresh), policy)
    if memo is not None and memo.start is not None and memo.start == start and memo.all_fit:
        memo.hits += 1
        placements = keeper.keep_fitting(
            valid, lost if not mass_loss else frozenset(), capacity, memo
        )
    else:
        on_live = valid if mass_loss or not lost else keeper.keep_off_lost(valid, lost)
        placements = keeper.keep_what_fits(on_live, capacity)
        if memo is not None and on_live is valid:
            # Every valid placement was taken from this start: what the next round may reuse.
            memo.start = start
            memo.all_fit = len(placements) == len(valid)
            memo.free = capacity.free_state()
            memo.ordered = placements if memo.all_fit else None
            memo.nodes_of = None
    return Kept(
        placements=placements,
        removals=keeper.removals,
        mass_loss=mass_loss,
        lost_nodes=lost,
    )


def _patched_judging(
    memo: KeepMemo,
    current: Sequence[Placement],
    demands: Sequence[Demand],
    version: object,
    keeper: _Keeper,
) -> list[Placement] | None:
    """``keep_valid(current)`` from the memo's, when ``current`` is the memo's placements
    less some and plus some (a write's placements read back in the round after it; the
    same demands and nodes' content): a placement's judgement reads its own fields, its
    model's demand and profiles, its nodes' content, the other placements of its slot
    (duplicates) and of its model (surplus), nothing of any other model. So every model
    none of whose placements went or came keeps its valid placements and removals; the
    others are judged again, on their own, as ``keep_valid`` judges them (slot order, one
    model at a time). None when that does not hold; ``keeper`` then is as it was."""
    if version is None or memo.inventory != version or not same_objects(memo.demands, demands):
        return None
    changes = changed_from(memo.current, current)
    if changes is None:
        return None
    removed, added = changes
    models = {p.model for p in (*removed, *added)}
    again = keeper.keep_valid([p for p in current if p.model in models])
    # The removals of the other models, in the memo's order, then the models judged again.
    keeper.removals = [
        *(r for r in memo.removals if r.placement.model not in models),
        *keeper.removals,
    ]
    # The other models' re-recorded placements only: a model judged again was judged from
    # this round's placements, and the round before's entry of one (an original the write
    # since replaced with its re-recorded form) would name a placement the store no
    # longer holds in a removal.
    keeper.recorded_as = {
        **{u: o for u, o in memo.recorded_as.items() if u.model not in models},
        **keeper.recorded_as,
    }
    # Both in slot order (a model's placements together): merged by it.
    return sorted([*(p for p in memo.valid if p.model not in models), *again], key=_slot_order)


def _same_judging(
    memo: KeepMemo, current: Sequence[Placement], demands: Sequence[Demand], version: object
) -> bool:
    """Whether ``keep_valid`` would read what it read in the memo's round."""
    return (
        version is not None
        and memo.inventory == version
        and len(memo.current) == len(current)
        and len(memo.demands) == len(demands)
        and all(map(is_, memo.current, current))
        and all(map(is_, memo.demands, demands))
    )


def _is_mass_loss(lost: int, relevant: int, policy: StalenessPolicy) -> bool:
    """Whether so many nodes look lost at once that the control plane should doubt itself.

    ``relevant`` counts the nodes that matter to the round: those hosting
    replicas and those able to take new ones. Counting fresh nodes matters for
    two reasons. A control plane that still hears from most of the cluster is
    not the one with the blip, so the loss is real. And new replicas only land
    on fresh nodes, so the fraction does not drop in the next round just
    because replacements were placed: a second round over the result comes to
    the same decision, rather than wiping what the first one kept.
    """
    return lost > 1 and lost > policy.mass_loss_fraction * relevant


@dataclass(slots=True)
class _Keeper:
    """The catalog as placements are judged against it, and the removals so far."""

    demands: Sequence[Demand]
    inventory: Mapping[str, Node]
    now: datetime
    removals: list[Removal] = field(default_factory=list)
    # Kept placements re-recorded with a new memory need, mapped to the stored
    # originals, so that a later removal names the placement the store holds.
    recorded_as: dict[Placement, Placement] = field(default_factory=dict)
    desired: dict[str, int] = field(init=False)
    position: dict[str, int] = field(init=False)
    profiles: dict[tuple[str, str], PlacementProfile] = field(init=False)

    def __post_init__(self) -> None:
        self.desired = {d.model: max(d.replicas, 0) for d in self.demands}
        self.position = {d.model: i for i, d in enumerate(self.demands)}
        self.profiles = {(d.model, p.name): p for d in self.demands for p in d.profiles}

    def drop(self, placement: Placement, reason: str) -> None:
        self.removals.append(Removal(self.recorded_as.get(placement, placement), reason))

    def keep_valid(self, current: Sequence[Placement]) -> list[Placement]:
        """Current placements minus those with a reason to go other than node loss or room.

        Sorted first so that which of two duplicates survives does not depend on
        the order the store returned them in.
        """
        kept: list[Placement] = []
        slots: set[tuple[str, int]] = set()
        ordered = sorted(current, key=_slot_order)
        keys = list(map(_slot_order, ordered))
        if len(set(keys)) < len(keys):
            # Two placements claim one slot (rare): only then does the rest of
            # the order matter, to say which one survives.
            ordered = sorted(current, key=_full_order)
            keys = list(map(_slot_order, ordered))
        for placement, slot in zip(ordered, keys, strict=True):
            duplicate = slot in slots
            slots.add(slot)
            profile = self.profiles.get((placement.model, placement.profile))
            reason = self._reason_to_drop(placement, profile, duplicate)
            if reason is not None:
                self.drop(placement, reason)
            elif profile is not None:
                kept.append(self._with_current_memory(placement, profile))
        return self._trim_surplus(kept)

    def _trim_surplus(self, kept: list[Placement]) -> list[Placement]:
        """Keep at most the wanted number of each model's replicas, lowest slots first.

        Surplus is a count, not a slot number: with three wanted and slots 0
        and 5 running, both stay and slot 1 is added. Judging by slot number
        would stop slot 5 and start another replica in its place, moving a
        running replica for no reason.
        """
        count: dict[str, int] = {}
        trimmed = []
        # ``kept`` is in slot order already (``keep_valid`` went through it so).
        for placement in kept:
            desired = self.desired[placement.model]
            seen = count.get(placement.model, 0)
            if seen < desired:
                count[placement.model] = seen + 1
                trimmed.append(placement)
            else:
                self.drop(placement, f"surplus replica (the model wants {desired})")
        return trimmed

    def keep_off_lost(self, placements: list[Placement], lost: frozenset[str]) -> list[Placement]:
        """The placements that touch no lost node; the others go, naming the node."""
        kept = []
        for placement in placements:
            gone = [name for name in placement.nodes if name in lost]
            if gone:
                self.drop(placement, self._lost_reason(min(gone)))
            else:
                kept.append(placement)
        return kept

    def hosts_of_what_fits(
        self, placements: list[Placement], capacity: Capacity, memo: KeepMemo | None = None
    ) -> set[str]:
        """The nodes ``keep_what_fits`` would leave hosting a placement (on a copy of capacity).

        ``placements`` are every valid one: with a ``memo``, the trial is what the next
        round may reuse (``KeepMemo``)."""
        trial, hosts = capacity.copy(), set[str]()
        start = capacity.free_state() if memo is not None else None
        fitting = []
        for placement in self._in_catalog_order(placements):
            if trial.take(placement.nodes, placement.gpus_per_node, placement.memory_gb_per_node):
                hosts.update(placement.nodes)
                fitting.append(placement)
        if memo is not None:
            memo.start = start
            memo.all_fit = len(fitting) == len(placements)
            memo.free = trial.free_state()
            memo.ordered = fitting if memo.all_fit else None
            memo.nodes_of = None
        return hosts

    def keep_fitting(
        self,
        valid: list[Placement],
        lost: frozenset[str],
        capacity: Capacity,
        memo: KeepMemo,
    ) -> list[Placement]:
        """``keep_off_lost`` then ``keep_what_fits``, when every valid placement was seen to
        fit from this very capacity (``memo.all_fit``): those on a lost node go (in slot
        order, naming it), the rest all fit (``KeepMemo`` says why), and the free capacity
        is the memo's, counted again only on the nodes a dropped placement ran on."""
        ordered = memo.ordered
        assert ordered is not None and memo.free is not None and memo.start is not None
        if memo.nodes_of is None:
            memo.nodes_of = list(map(_nodes_of, ordered))
        nodes_of = memo.nodes_of
        gone_at = _meeting(lost, nodes_of) if lost else []
        # ``keep_off_lost``'s removals, in its order (``valid``'s: slot order, one a slot).
        for placement in sorted((ordered[i] for i in gone_at), key=_slot_order):
            self.drop(placement, self._lost_reason(min(n for n in placement.nodes if n in lost)))
        free_gpus, free_memory = dict(memo.free[0]), dict(memo.free[1])
        touched = {name for i in gone_at for name in nodes_of[i]}.intersection(free_gpus)
        if touched:
            # Counted again from the start over what stays there, in catalog order.
            gone = set(gone_at)
            start_gpus, start_memory = memo.start
            for name in touched:
                free_gpus[name], free_memory[name] = start_gpus[name], start_memory[name]
            for i in _meeting(touched, nodes_of):
                if i in gone:
                    continue
                names, placement = nodes_of[i], ordered[i]
                for name in names:
                    if name in touched:
                        free_gpus[name] -= placement.gpus_per_node
                        memory = free_memory[name]
                        if memory is not None:
                            free_memory[name] = memory - placement.memory_gb_per_node
        capacity.set_free_state(free_gpus, free_memory)
        if not gone_at:
            return list(ordered)
        kept: list[Placement] = []
        last = 0
        for i in gone_at:
            kept += ordered[last:i]
            last = i + 1
        kept += ordered[last:]
        return kept

    def keep_what_fits(self, placements: list[Placement], capacity: Capacity) -> list[Placement]:
        """Let placements consume capacity, dropping any that would overcommit a node.

        Taken in catalog order, replicas ascending, so when a node shrank (or
        its reserved cards grew) it is the later replicas there that go.
        """
        fitting = []
        for placement in self._in_catalog_order(placements):
            share = (placement.nodes, placement.gpus_per_node, placement.memory_gb_per_node)
            if capacity.take(*share):
                fitting.append(placement)
            else:
                self.drop(placement, _no_room_reason(placement, capacity))
        return fitting

    def _in_catalog_order(self, placements: list[Placement]) -> Iterator[Placement]:
        # ``placements`` are in slot order (model, then replica), so grouping them
        # by model and taking the models in catalog order is that order, unsorted.
        by_model: dict[str, list[Placement]] = {}
        for placement in placements:
            by_model.setdefault(placement.model, []).append(placement)
        for model in sorted(by_model, key=self.position.__getitem__):
            yield from by_model[model]

    def _reason_to_drop(
        self, placement: Placement, profile: PlacementProfile | None, duplicate: bool
    ) -> str | None:
        """Why a current placement must go whatever the nodes' health and room, or None."""
        desired = self.desired.get(placement.model)
        if desired is None:
            return "model removed from catalog"
        if duplicate:
            return f"another placement already holds replica {placement.replica}"
        if profile is None:
            return f"profile {placement.profile} removed from the model"
        if _shape_changed(placement, profile):
            return _shape_change_reason(placement, profile)
        if placement.replica < 0:
            return f"replica {placement.replica} is not a slot (slots count from 0)"
        gpu_class, selector, inventory = profile.gpu_class, profile.node_selector, self.inventory
        for name in placement.nodes:
            node = inventory.get(name)
            if node is not None and (
                (gpu_class is not None and node.gpu_class != gpu_class)
                or (selector and missing_label(node.labels, selector) is not None)
            ):
                break
        else:
            # No node misfits (the usual case): ``hardware_misfit``'s checks, without
            # building its message for every node of every running replica.
            return None
        misfits = [
            (name, misfit)
            for name in placement.nodes
            # A node missing from the inventory is judged by the loss rules.
            if (node := self.inventory.get(name)) is not None
            and (misfit := hardware_misfit(node, profile)) is not None
        ]
        if misfits:
            name, misfit = min(misfits)
            return f"node {name} no longer fits: {misfit}"
        return None

    def _with_current_memory(self, placement: Placement, profile: PlacementProfile) -> Placement:
        # Memory is a need, not part of the hardware shape: a replica whose
        # profile now asks for more memory stays where it is if the node has
        # room, and is accounted at the new figure so the node is not overcommitted.
        if placement.memory_gb_per_node == profile.min_memory_gb:
            return placement
        updated = replace(placement, memory_gb_per_node=profile.min_memory_gb)
        self.recorded_as[updated] = placement
        return updated

    def _lost_reason(self, name: str) -> str:
        node = self.inventory.get(name)
        if node is None:
            return f"node {name} lost (no longer in the inventory)"
        return f"node {name} lost (not heard from for {format_age(self.now - node.reported_at)})"


def _no_room_reason(placement: Placement, capacity: Capacity) -> str:
    """The first node (by name) a placement no longer has room on, and what is short."""
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
    raise AssertionError(f"{placement} has room; there is no reason to give")


def _shape_changed(placement: Placement, profile: PlacementProfile) -> bool:
    return (
        placement.gpus_per_node != profile.gpus_per_node
        or placement.gpu_class != profile.gpu_class
        or len(placement.nodes) != profile.nodes
        # A replica recorded twice on one node is not the shape it claims.
        or (profile.nodes > 1 and len(set(placement.nodes)) != profile.nodes)
    )


def _shape_change_reason(placement: Placement, profile: PlacementProfile) -> str:
    was = _shape(len(placement.nodes), placement.gpus_per_node, placement.gpu_class)
    now = _shape(profile.nodes, profile.gpus_per_node, profile.gpu_class)
    if was == now:
        return f"placement names a node more than once: {', '.join(placement.nodes)}"
    return f"profile {profile.name} changed shape: was {was}, now {now}"


def _shape(nodes: int, gpus_per_node: int, gpu_class: str | None) -> str:
    per_node = "CPU only" if gpu_class is None else f"{gpus_per_node} {gpu_class}"
    return f"{nodes} node{'s' if nodes != 1 else ''} x {per_node}"


_slot_order = attrgetter("model", "replica")
_nodes_of = attrgetter("nodes")


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


def _meeting(names: AbstractSet[str], nodes_of: list[tuple[str, ...]]) -> list[int]:
    """The indices, ascending, of the entries of ``nodes_of`` holding any of ``names``:
    each entry judged in C (``isdisjoint`` mapped, then ``list.index`` for each one
    met), not a step of Python for each of 170,000 kept placements when one node is lost."""
    disjoint = list(map(names.isdisjoint, nodes_of))
    met: list[int] = []
    at = -1
    while True:
        try:
            at = disjoint.index(False, at + 1)
        except ValueError:
            return met
        met.append(at)
