"""Preemption: a missing replica of a model takes room from models of lower priority.

After the missing replicas are placed, a replica still unplaced may evict
replicas of models with a *strictly* lower ``placement.priority`` (never equal
or higher), if that makes room for it. Per node the victims are taken lowest
priority first and, within a priority, largest first, so that as few replicas
as possible go; among nodes (or, for a gang, fabrics) the one whose victims
have the lowest highest priority wins, then the fewest victims, then the fewest
GPUs evicted, then the name. A gang preemptor evicts on all its nodes or on
none. Nothing is evicted unless the preemptor is then placed: the room is
checked with the victims' share given back before anything is decided.

A victim that was running is removed with the reason ``preempted by
MODEL[replica]``; one placed earlier in the same round is simply not placed.
Either way its slot is then placed again, without preempting anything, if it
fits somewhere else; otherwise it is reported unplaced with that reason.

Old replicas a rollout holds (``scheduler.planner.rollout``) are never victims: they
are not among the replicas this sees, only their capacity is. Nor does a
preemptor go to a node its model backs off from.

Models are visited in placement order (priority first), so a higher-priority
model preempts first. A cluster-wide switch (``StalenessPolicy.preemption``)
turns it off; it is an input recorded with every round.

Cost: nothing when no model with an unplaced replica outranks a running
replica; otherwise O(N) per profile tried per unplaced replica, over the nodes
the profile may use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.fit import gpus_fit, memory_fits
from scheduler.planner.fleet.placements import Demand, Placement, Removal
from scheduler.planner.order import placement_order
from scheduler.planner.packing import Attempt, Option, options

_Key = tuple[int, int, int, str]


@dataclass(slots=True)
class Preempted:
    """What preemption changed: running replicas evicted (removals) and slots to explain."""

    evicted: list[Removal] = field(default_factory=list)
    kept: list[Placement] = field(default_factory=list)
    # (model, replica) of each replica placed by evicting others: it must stay
    # where its evictions made room (``scheduler.planner.spread_repair`` leaves it there).
    preemptors: list[tuple[str, int]] = field(default_factory=list)


def preempt(demands: Sequence[Demand], attempt: Attempt, kept: list[Placement]) -> Preempted:
    """Evict for the unplaced replicas that outrank running ones; update ``attempt`` in place."""
    priority = {d.model: d.priority for d in demands}
    outcome = Preempted(kept=list(kept))
    if not attempt.failed:
        return outcome
    lowest_running = min((priority[p.model] for p in (*kept, *attempt.placed)), default=None)
    if lowest_running is None or all(priority[m] <= lowest_running for m in attempt.failed):
        return outcome
    state = _State(attempt, outcome, priority)
    displaced: dict[str, list[tuple[int, str]]] = {}
    for demand in placement_order(demands):
        if demand.model not in attempt.failed:
            continue
        tried, replicas = attempt.failed[demand.model]
        left = []
        for replica in replicas:
            victims = state.make_room(demand, replica, tried)
            if victims is None:
                left.append(replica)
                continue
            for victim in victims:
                displaced.setdefault(victim.model, []).append(
                    (victim.replica, f"preempted by {demand.model}[{replica}]")
                )
        if left:
            attempt.failed[demand.model] = (tried, left)
        else:
            del attempt.failed[demand.model]
    _place_again(demands, attempt, displaced)
    return outcome


def _place_again(
    demands: Sequence[Demand], attempt: Attempt, displaced: dict[str, list[tuple[int, str]]]
) -> None:
    """Give each victim's slot a place elsewhere if one is free; never by preempting."""
    no_room: set[tuple[str | None, tuple[tuple[str, str], ...], int, int, int]] = set()
    for demand in placement_order(demands):
        slots = displaced.get(demand.model)
        if not slots:
            continue
        tried = options(demand.profiles)
        for replica, reason in sorted(slots):
            new = attempt.place_one(demand.model, replica, tried, no_room)
            if new is not None:
                attempt.placed.append(new)
                continue
            entry = attempt.failed.setdefault(demand.model, (tried, []))
            entry[1].append(replica)
            entry[1].sort()
            attempt.replica_notes[(demand.model, replica)] = reason


@dataclass(slots=True)
class _State:
    attempt: Attempt
    outcome: Preempted
    priority: dict[str, int]
    on_node: dict[str, list[Placement]] = field(init=False)

    def __post_init__(self) -> None:
        self.on_node = {}
        for p in (*self.outcome.kept, *self.attempt.placed):
            for name in p.nodes:
                self.on_node.setdefault(name, []).append(p)

    def make_room(
        self, demand: Demand, replica: int, tried: list[Option]
    ) -> list[Placement] | None:
        """Evict for one replica and place it; the victims, or None when no profile can."""
        for profile, _ in tried:
            found = (
                self._gang(demand, profile) if profile.nodes > 1 else self._single(demand, profile)
            )
            if found is None:
                continue
            nodes, victims = found
            self._evict(victims, f"preempted by {demand.model}[{replica}]")
            capacity = self.attempt.capacity
            if not all(
                gpus_fit(capacity.free_gpus(n), profile.gpus_per_node)
                and memory_fits(capacity.free_memory(n), profile.min_memory_gb)
                for n in nodes
            ):
                raise AssertionError(f"preemption made no room on {nodes} for {demand.model}")
            capacity.consume(nodes, profile.gpus_per_node, profile.min_memory_gb)
            self.attempt.spread.add(demand.model, nodes)
            placed = self.attempt.placement(demand.model, replica, profile, nodes)
            self.attempt.placed.append(placed)
            self.outcome.preemptors.append((demand.model, replica))
            for name in nodes:
                self.on_node.setdefault(name, []).append(placed)
            return victims
        return None

    def _single(
        self, demand: Demand, profile: PlacementProfile
    ) -> tuple[tuple[str, ...], list[Placement]] | None:
        found = []
        avoid = self.attempt.avoid.get(demand.model, frozenset())
        for name in self.attempt.eligible_nodes(profile):
            if name not in self.on_node or name in avoid:
                continue
            room = self._victims_on(name, demand, profile)
            if room is not None:
                found.append((room[0], name, room[1]))
        for _, name, victims in sorted(found, key=lambda f: f[0]):
            if self._spread_allows(demand.model, profile, (name,)):
                return (name,), victims
        return None

    def _gang(
        self, demand: Demand, profile: PlacementProfile
    ) -> tuple[tuple[str, ...], list[Placement]] | None:
        capacity = self.attempt.capacity
        by_fabric: dict[str, list[tuple[_Key, str, list[Placement]]]] = {}
        avoid = self.attempt.avoid.get(demand.model, frozenset())
        for name in self.attempt.eligible_nodes(profile):
            fabric = capacity.node(name).fabric
            if fabric is None or name in avoid:
                continue
            found = self._victims_on(name, demand, profile)
            if found is not None:
                by_fabric.setdefault(fabric, []).append((found[0], name, found[1]))
        groups = []
        for fabric, entries in by_fabric.items():
            if len(entries) < profile.nodes:
                continue
            chosen = sorted(entries)[: profile.nodes]
            victims = list({id(v): v for e in chosen for v in e[2]}.values())
            key = (
                max((self.priority[v.model] for v in victims), default=-(1 << 62)),
                len(victims),
                sum(v.gpus_per_node * len(v.nodes) for v in victims),
                fabric,
            )
            groups.append((key, tuple(sorted(e[1] for e in chosen)), victims))
        for _, nodes, victims in sorted(groups, key=lambda g: g[0]):
            if self._spread_allows(demand.model, profile, nodes):
                return nodes, victims
        return None

    def _victims_on(
        self, name: str, demand: Demand, profile: PlacementProfile
    ) -> tuple[_Key, list[Placement]] | None:
        """The fewest lowest-priority replicas on a node whose eviction makes room there."""
        capacity = self.attempt.capacity
        gpus, memory = capacity.free_gpus(name), capacity.free_memory(name)
        candidates = sorted(
            (p for p in self.on_node.get(name, ()) if self.priority[p.model] < demand.priority),
            key=lambda p: (
                self.priority[p.model],
                -p.gpus_per_node,
                -p.memory_gb_per_node,
                p.model,
                p.replica,
            ),
        )
        victims: list[Placement] = []
        for victim in [None, *candidates]:
            if victim is not None:
                victims.append(victim)
                gpus += victim.gpus_per_node
                memory = None if memory is None else memory + victim.memory_gb_per_node
            if gpus_fit(gpus, profile.gpus_per_node) and memory_fits(memory, profile.min_memory_gb):
                if not victims:
                    return (-(1 << 62), 0, 0, name), []
                key = (
                    max(self.priority[v.model] for v in victims),
                    len(victims),
                    sum(v.gpus_per_node * len(v.nodes) for v in victims),
                    name,
                )
                return key, victims
        return None

    def _spread_allows(self, model: str, profile: PlacementProfile, nodes: tuple[str, ...]) -> bool:
        spread = self.attempt.spread
        if not spread.matters(model):
            return True
        eligible = self.attempt.eligible_nodes(profile)
        if len(nodes) == 1:
            return spread.choose(model, nodes, lambda: eligible, prefer=False).node is not None
        entries = [(0, 0.0, n) for n in nodes]
        chosen = spread.choose_gang(model, entries, len(nodes), lambda: eligible, prefer=False)
        return isinstance(chosen, tuple)

    def _evict(self, victims: list[Placement], reason: str) -> None:
        attempt = self.attempt
        kept_ids = {id(p) for p in self.outcome.kept}
        for victim in victims:
            attempt.capacity.release(victim.nodes, victim.gpus_per_node, victim.memory_gb_per_node)
            attempt.spread.remove(victim.model, victim.nodes)
            for name in victim.nodes:
                self.on_node[name] = [p for p in self.on_node[name] if p is not victim]
            if id(victim) in kept_ids:
                self.outcome.kept = [p for p in self.outcome.kept if p is not victim]
                self.outcome.evicted.append(Removal(victim, reason))
            else:
                attempt.placed = [p for p in attempt.placed if p is not victim]
