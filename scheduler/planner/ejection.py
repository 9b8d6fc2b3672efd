"""Making room for an unplaced replica by re-placing this round's new ones: ejection chains.

Placing replicas one at a time, each with its preferred profile, can leave a
replica unplaced while the cluster has room for it *in total*: on the openb
inventory every DeepSeek replica takes its preferred G2 node, the G3 nodes it
could also use stay idle, and Llama-8B (G2 or V100M32 only) finds no G2 room;
Qwen takes the T4 nodes BGE needs, while it could run on one G2 card. CP-SAT
places every card there; the planner left 312 idle (0.9498).

So when the round leaves a replica unplaced, this pass looks for a short chain:
take a replica placed *this round* (never a running one: stability) off a node,
re-place it elsewhere with any of its own profiles (directly into free room, or
by taking another new replica off its node in turn, up to ``DEPTH`` replicas
displaced), and put the unplaced replica where the first one was. A chain is
made only when it makes the round better in the planner's own order
(``packing._score``: per priority tier the GPUs placed, then the replicas), so
a replica displaced is never one of a higher priority, never left unplaced,
and the cards placed never fall at any tier.

A replica larger than every new replica on the nodes it could use may instead take a
node cleared of up to two smaller ones (``_clear``), each re-placed directly into free
room: on synthetic 5,000 an 8-card A100 replica leaves the ``pool: prod`` node that the
2-card replicas need for a ``pool: batch`` node whose two 4-card replicas go to idle
L40S nodes (19,167 -> 19,883 GPUs, CP-SAT's best in 10 deterministic seconds).

What it leaves alone: gangs (multi-node replicas are neither placed nor displaced
here), models with ``spread_required`` (their rule is judged per placement),
preemptors, and the nodes a model backs off from. New replicas only, so the next
round, with nothing changed, has none to displace and changes nothing.

Cost: nothing unless a replica is unplaced. Otherwise the new replicas are
grouped by (model, profile), the shapes a chain can displace; a search for one
unplaced replica visits the groups on its profile's nodes (a few dozen), and for
each asks whether one of its replicas could be re-placed (an O(L log N) best-fit
look-up, or one level deeper the same over the groups of the other pool), each
answer remembered until a chain changes the capacity. A node to clear is looked for
among the hosts of the smaller groups of the profile's class (at most ``_SCAN`` usable
ones a group), once per requirement and priority until a chain changes the capacity.
A model whose next replica finds no chain stops there: its other replicas would
search the same capacity.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.capacity import Capacity
from scheduler.planner.fleet.fit import gpu_class_matches, memory_fits, selector_key
from scheduler.planner.fleet.placements import Demand, Placement
from scheduler.planner.order import placement_order
from scheduler.planner.spread import Spread

# packing's ``Requirement``, spelled out (see ``Attempt``).
_Requirement = tuple[str | None, tuple[tuple[str, str], ...], int, int, int]


class _Strategy(Protocol):
    @property
    def spreads(self) -> bool: ...


class Attempt(Protocol):
    """What this pass needs of ``scheduler.planner.packing.Attempt`` (which calls it: an
    import of packing here would be a circle)."""

    capacity: Capacity
    spread: Spread
    placed: list[Placement]
    # model -> ((profile, requirement) tried, replica slots unplaced): packing's ``Option``
    failed: dict[str, tuple[list[tuple[PlacementProfile, _Requirement]], list[int]]]
    notes: dict[str, str]
    avoid: Mapping[str, frozenset[str]]

    @property
    def strategy(self) -> _Strategy: ...

    def eligible_nodes(self, profile: PlacementProfile) -> list[str]: ...

    def placement(
        self, model: str, replica: int, profile: PlacementProfile, nodes: tuple[str, ...]
    ) -> Placement: ...


DEPTH = 2  # replicas displaced by one chain at most (a node cleared by ``_clear`` counts one)
_PAIR = 2  # smaller replicas a node may be cleared of for a larger one
# Replicas of one group looked at per search: where one leaving frees too little, the
# next few rarely free more, and looking at all of them is a scan per unplaced replica.
_SCAN = 16
_VISITS_PER_REPLICA = 20
_SWEEPS = 4  # passes over the unplaced models; a chain that helps a later model can help an earlier


@dataclass(frozen=True, slots=True)
class _Step:
    """Put ``model``'s replica ``replica`` on ``node`` with ``profile`` (``index``: the
    slot in ``Attempt.placed`` it takes over when it was displaced, else None)."""

    model: str
    replica: int
    profile: PlacementProfile
    node: str
    index: int | None


@dataclass(slots=True)
class _Chains:
    attempt: Attempt
    priority: Mapping[str, int]
    options: Mapping[str, list[PlacementProfile]]
    movable: frozenset[str]
    # (model, profile) -> indices into attempt.placed of its single-node new replicas
    groups: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    profile_of: dict[tuple[str, str], PlacementProfile] = field(default_factory=dict)
    # GPU class of the profile (None: a CPU profile, on any node) -> its groups, in order
    by_class: dict[str | None, list[tuple[str, str]]] = field(default_factory=dict)
    # (class, selector, GPUs, memory) -> whether a node has room for it; forgotten when a
    # chain changes the room of that class.
    _room: dict[tuple[str | None, tuple[tuple[str, str], ...], int, int], bool] = field(
        default_factory=dict
    )
    # (model, profile name, depth) that found no chain, forgotten likewise. Which nodes the
    # chain being built has banned is not part of the key: a node or two less rarely
    # decides, and remembering is what keeps a search from being a scan per replica.
    _failed: set[tuple[str, str, int]] = field(default_factory=set)
    _movable: dict[tuple[str, int], bool] = field(default_factory=dict)
    _requirement: dict[int, tuple[str | None, tuple[tuple[str, str], ...], int, int]] = field(
        default_factory=dict
    )
    # (requirement, priority) for which ``_clear`` found no node, forgotten likewise (the
    # nodes banned and backed off from aside, as for ``_failed``).
    _uncleared: set[tuple[tuple[str | None, tuple[tuple[str, str], ...], int, int], int]] = field(
        default_factory=set
    )
    # node -> indices into attempt.placed of the single-node new replicas on it (``_clear``)
    on_node: dict[str, list[int]] = field(default_factory=dict)
    # Groups looked at so far, and how many a round may look at (see ``eject``).
    visits: int = 0
    budget: int = 0

    def index(self) -> None:
        for i, p in enumerate(self.attempt.placed):
            self._enter(i, p)

    def _enter(self, i: int, p: Placement) -> None:
        if len(p.nodes) != 1 or p.model not in self.movable:
            return
        key = (p.model, p.profile)
        self.groups.setdefault(key, []).append(i)
        self.on_node.setdefault(p.nodes[0], []).append(i)
        if key not in self.profile_of:
            for profile in self.options[p.model]:
                if profile.name == p.profile:
                    self.profile_of[key] = profile
                    self.by_class.setdefault(profile.gpu_class, []).append(key)

    def direct(self, model: str, profile: PlacementProfile, banned: tuple[str, ...]) -> str | None:
        """The node the round's own way would choose for one more replica, not ``banned``
        (the nodes a chain being built already counts on)."""
        if profile.nodes != 1 or not self.room(profile):
            return None
        return self._find(model, profile, banned)

    def room(self, profile: PlacementProfile) -> bool:
        """Whether any fresh node of the profile's class and labels has room for one replica
        (back-offs aside): remembered per requirement until a chain changes its class."""
        full = self._requirement_of(profile)
        known = self._room.get(full)
        if known is None:
            capacity = self.attempt.capacity
            known = capacity.may_fit(profile) and next(capacity.fitting(profile), None) is not None
            self._room[full] = known
        return known

    def _requirement_of(
        self, profile: PlacementProfile
    ) -> tuple[str | None, tuple[tuple[str, str], ...], int, int]:
        # Keyed by the profile object (they live as long as the round) to sort its
        # selector once, not at each of the ~85,000 asks of a 5,000-node round.
        full = self._requirement.get(id(profile))
        if full is None:
            full = self._requirement[id(profile)] = (
                profile.gpu_class,
                selector_key(profile.node_selector),
                profile.gpus_per_node,
                profile.min_memory_gb,
            )
        return full

    def _find(self, model: str, profile: PlacementProfile, banned: tuple[str, ...]) -> str | None:
        attempt = self.attempt
        found: str | None = None
        if attempt.capacity.may_fit(profile):
            avoid = attempt.avoid.get(model, frozenset()).union(banned)
            names = (e[2] for e in attempt.capacity.fitting(profile, avoid))
            choice = attempt.spread.choose(
                model,
                names,
                lambda: attempt.eligible_nodes(profile),
                prefer=attempt.strategy.spreads,
            )
            found = choice.node
        return found

    def chain(
        self,
        model: str,
        replica: int,
        profile: PlacementProfile,
        depth: int,
        banned: tuple[str, ...],
    ) -> list[_Step] | None:
        """Steps that end with ``model``'s ``replica`` placed with ``profile``, displacing
        at most ``depth`` new replicas of no higher priority; None when there is none."""
        node = self.direct(model, profile, banned)
        if node is not None:
            return [_Step(model, replica, profile, node, None)]
        if depth == 0 or profile.nodes != 1:
            return None
        memo = (model, profile.name, depth)
        if memo in self._failed:
            return None
        avoid = self.attempt.avoid.get(model, frozenset())
        keys = self.by_class.get(profile.gpu_class, [])
        if profile.gpu_class is not None:
            keys = keys + self.by_class.get(None, [])
        for key in keys:
            self.visits += 1
            if self.visits > self.budget:
                return None
            indices = self.groups[key]
            other = self.profile_of[key]
            if (
                not indices
                or self.priority[key[0]] > self.priority[model]
                # Only a replica at least as large as the one to place: its leaving is then
                # room enough on whichever node it runs, so the first one found will do
                # (a smaller one would need cards free beside it, a scan per search).
                or other.gpus_per_node < profile.gpus_per_node
            ):
                continue
            if not self._may_move(key[0], depth - 1, banned):
                continue
            # Nodes chosen for a selector that asks at least as much carry every label needed.
            labelled = profile.node_selector.items() <= other.node_selector.items()
            for i in self._hosts(indices, profile, avoid, banned, labelled):
                victim = self.attempt.placed[i]
                host = victim.nodes[0]
                for alternative in self.options[victim.model]:
                    sub = self.chain(
                        victim.model, victim.replica, alternative, depth - 1, (*banned, host)
                    )
                    if sub is not None and self._better(model, profile, victim, alternative, sub):
                        last = sub[-1]
                        sub[-1] = _Step(last.model, last.replica, last.profile, last.node, i)
                        return [*sub, _Step(model, replica, profile, host, None)]
                # Every replica of a group re-places the same way, wherever it runs.
                break
        # A cleared node's replicas go straight into free room, so the search is the same
        # at any depth: made once, at the first.
        steps = self._clear(model, replica, profile, banned, avoid) if depth == 1 else None
        if steps is not None:
            return steps
        self._failed.add(memo)
        return None

    def _clear(
        self,
        model: str,
        replica: int,
        profile: PlacementProfile,
        banned: tuple[str, ...],
        avoid: frozenset[str],
    ) -> list[_Step] | None:
        """Steps that put ``model``'s replica on a node cleared of up to ``_PAIR`` smaller
        new replicas, each re-placed directly into free room; None when there is none.

        What a single displaced replica cannot do: on synthetic 5,000 an 8-card A100
        replica leaves a ``pool: prod`` node (for the 2-card replicas that need one) only
        if a ``pool: batch`` node holding two 4-card ones is cleared, each to an L40S node.
        """
        need = profile.gpus_per_node
        if need == 0:
            return None
        memo = (self._requirement_of(profile), self.priority[model])
        if memo in self._uncleared:
            return None
        capacity = self.attempt.capacity
        placed = self.attempt.placed
        # Only groups whose model has room somewhere with one of its profiles: a node
        # holding one that has none cannot be cleared (on synthetic 10,000, none can).
        smaller = [
            key
            for key in self.by_class.get(profile.gpu_class, [])
            if 0 < self.profile_of[key].gpus_per_node < need
            and self.priority[key[0]] <= self.priority[model]
            and any(p.nodes == 1 and self.room(p) for p in self.options[key[0]])
        ]
        seen: set[str] = set()
        for key in smaller:
            self.visits += 1
            if self.visits > self.budget:
                return None
            # Counted as in ``_hosts``, but only nodes the profile may use: a group's first
            # replicas often run where its selector does not send this one.
            looked = 0
            for i in self.groups[key]:
                if looked == _SCAN:
                    break
                host = placed[i].nodes[0]
                if host in seen or host in banned or host in avoid:
                    continue
                seen.add(host)
                node = capacity.node(host)
                if not gpu_class_matches(node.gpu_class, profile) or not _labelled(
                    node.labels, profile.node_selector
                ):
                    continue
                looked += 1
                steps = self._cleared(model, profile, host, banned)
                if steps is not None:
                    return [*steps, _Step(model, replica, profile, host, None)]
        self._uncleared.add(memo)
        return None

    def _cleared(
        self, model: str, profile: PlacementProfile, host: str, banned: tuple[str, ...]
    ) -> list[_Step] | None:
        """The fewest (at most ``_PAIR``) new replicas on ``host`` whose leaving makes room
        for ``profile``, each re-placed directly, if the round loses no GPUs by it."""
        capacity = self.attempt.capacity
        placed = self.attempt.placed
        free = capacity.free_gpus(host)
        victims = sorted(
            (
                i
                for i in self.on_node.get(host, ())
                if placed[i].gpus_per_node > 0
                and self.priority[placed[i].model] <= self.priority[model]
            ),
            key=lambda i: (-placed[i].gpus_per_node, i),
        )[:_PAIR]
        taken: list[int] = []
        for i in victims:
            if free >= profile.gpus_per_node:
                break
            taken.append(i)
            free += placed[i].gpus_per_node
        if free < profile.gpus_per_node or not taken:
            return None
        memory = capacity.free_memory(host)
        freed = (
            None if memory is None else memory + sum(placed[i].memory_gb_per_node for i in taken)
        )
        if not memory_fits(freed, profile.min_memory_gb):
            return None
        steps: list[_Step] = []
        gpus: dict[int, int] = {self.priority[model]: profile.gpus_per_node}
        for i in taken:
            victim = placed[i]
            away = (*banned, host, *(s.node for s in steps))
            for alternative in self.options[victim.model]:
                node = self.direct(victim.model, alternative, away)
                if node is not None:
                    steps.append(_Step(victim.model, victim.replica, alternative, node, i))
                    tier = self.priority[victim.model]
                    gpus[tier] = (
                        gpus.get(tier, 0) + alternative.gpus_per_node - victim.gpus_per_node
                    )
                    break
            else:
                return None
        for tier in sorted(gpus, reverse=True):
            if gpus[tier] != 0:
                return steps if gpus[tier] > 0 else None
        return steps

    def _may_move(self, model: str, depth: int, banned: tuple[str, ...]) -> bool:
        """Whether a replica of ``model`` might be re-placed, judged from what is remembered
        before looking for one whose leaving frees enough (which costs a scan). Remembered
        until the next chain, whatever the nodes banned: it is only a first sieve."""
        known = self._movable.get((model, depth))
        if known is not None:
            return known
        answer = False
        for alternative in self.options[model]:
            if alternative.nodes != 1:
                continue
            if self.direct(model, alternative, banned) is not None or (
                depth > 0 and (model, alternative.name, depth) not in self._failed
            ):
                answer = True
                break
        self._movable[(model, depth)] = answer
        return answer

    def _hosts(
        self,
        indices: list[int],
        profile: PlacementProfile,
        avoid: frozenset[str],
        banned: tuple[str, ...],
        labelled: bool,
    ) -> Iterator[int]:
        """The replicas of one group whose node would fit ``profile`` once they left it."""
        capacity = self.attempt.capacity
        for i in indices[:_SCAN]:
            victim = self.attempt.placed[i]
            host = victim.nodes[0]
            if host in banned or host in avoid:
                continue
            node = capacity.node(host)
            if not gpu_class_matches(node.gpu_class, profile):
                continue
            if not labelled and not _labelled(node.labels, profile.node_selector):
                continue
            gpus = capacity.free_gpus(host) + victim.gpus_per_node
            memory = capacity.free_memory(host)
            freed = None if memory is None else memory + victim.memory_gb_per_node
            if (profile.gpus_per_node == 0 or gpus >= profile.gpus_per_node) and memory_fits(
                freed, profile.min_memory_gb
            ):
                yield i

    def _better(
        self,
        model: str,
        profile: PlacementProfile,
        victim: Placement,
        alternative: PlacementProfile,
        sub: list[_Step],
    ) -> bool:
        """Whether the chain raises the round in the planner's order: per tier GPUs, then
        replicas. ``sub`` re-places ``victim`` (its last step) and whatever it displaced."""
        gpus: dict[int, int] = {}

        def add(name: str, cards: int) -> None:
            gpus[self.priority[name]] = gpus.get(self.priority[name], 0) + cards

        add(model, profile.gpus_per_node)
        add(victim.model, alternative.gpus_per_node - victim.gpus_per_node)
        for step in sub[:-1]:
            moved = self.attempt.placed[step.index] if step.index is not None else None
            add(step.model, step.profile.gpus_per_node - (moved.gpus_per_node if moved else 0))
        for tier in sorted(gpus, reverse=True):
            if gpus[tier] != 0:
                return gpus[tier] > 0
        return True  # the same cards, one more replica at the unplaced one's tier

    def apply(self, steps: list[_Step]) -> Placement:
        """Carry out a chain; the last step is the unplaced replica, placed."""
        attempt = self.attempt
        for step in steps:
            if step.index is not None:
                old = attempt.placed[step.index]
                attempt.capacity.release(old.nodes, old.gpus_per_node, old.memory_gb_per_node)
                attempt.spread.remove(old.model, old.nodes)
                self.groups[(old.model, old.profile)].remove(step.index)
                self.on_node[old.nodes[0]].remove(step.index)
        new = None
        for step in steps:
            profile = step.profile
            attempt.capacity.consume((step.node,), profile.gpus_per_node, profile.min_memory_gb)
            attempt.spread.add(step.model, (step.node,))
            placement = attempt.placement(step.model, step.replica, profile, (step.node,))
            if step.index is None:
                new = placement
                attempt.placed.append(placement)
                self._enter(len(attempt.placed) - 1, placement)
            else:
                attempt.placed[step.index] = placement
                self._enter(step.index, placement)
        # What a chain changed: the free room on its nodes, so where every profile of
        # their classes (and every CPU profile) fits.
        classes = {attempt.capacity.node(step.node).gpu_class for step in steps}
        for key in [k for k in self._room if k[0] is None or k[0] in classes]:
            del self._room[key]
        self._failed.clear()
        self._movable.clear()
        self._uncleared.clear()
        assert new is not None
        return new


def eject(attempt: Attempt, demands: Sequence[Demand]) -> int:
    """Place what ``attempt`` left unplaced by chains of re-placed new replicas (see module).

    Updates ``attempt`` in place (placements, capacity, spread, failures) and
    returns how many replicas it placed.
    """
    if not attempt.failed or not attempt.placed:
        return 0
    movable = frozenset(d.model for d in demands if not d.spread_required)
    chains = _Chains(
        attempt,
        {d.model: d.priority for d in demands},
        # Highest priority first, declaration order between equals (packing.options).
        {d.model: sorted(d.profiles, key=lambda p: -p.priority) for d in demands},
        movable,
    )
    chains.index()
    # A bound on the search, in groups looked at: a fleet of one-replica models (the
    # 7,064 openb pods) has a group per model, and a search per unplaced replica over
    # all of them is quadratic. Counted, not timed, so the same inputs give the same plan.
    chains.budget = _VISITS_PER_REPLICA * len(attempt.placed)
    order = [d for d in placement_order(demands) if not d.spread_required]
    placed = 0
    for _ in range(_SWEEPS):
        progress = False
        for demand in order:
            if chains.visits > chains.budget:
                return placed
            entry = attempt.failed.get(demand.model)
            if entry is None:
                continue
            tried, replicas = entry
            while replicas:
                steps = _first_chain(chains, demand.model, replicas[0], tried)
                if steps is None:
                    break
                chains.apply(steps)
                replicas.pop(0)
                placed += 1
                progress = True
            if not replicas:
                del attempt.failed[demand.model]
                attempt.notes.pop(demand.model, None)
        if not progress:
            break
    return placed


def _first_chain(
    chains: _Chains,
    model: str,
    replica: int,
    tried: Sequence[tuple[PlacementProfile, _Requirement]],
) -> list[_Step] | None:
    """The shortest chain for one replica: every profile directly, then one displaced, ..."""
    for depth in range(DEPTH + 1):
        for profile, _ in tried:
            steps = chains.chain(model, replica, profile, depth, ())
            if steps is not None:
                return steps
    return None


def _labelled(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    """Whether a node carries every selector label (``fit.missing_label`` without naming
    the one missing, which sorts the selector: the search asks this ~120,000 times)."""
    return all(labels.get(k) == v for k, v in selector.items())
