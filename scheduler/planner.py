"""The placement planner: (demands, inventory, current placements, now) -> plan.

Pure: no I/O, no clock (``now`` is given), no randomness, and no dependence on
the order of ``nodes`` or ``current``. The same inputs give the same plan
(ARCHITECTURE invariant 5), which is what makes a round replayable when
someone asks later why a replica went where it went. ``demands`` order does
matter, on purpose: earlier models are placed first, so catalog order is the
order in which models claim scarce hardware.

A round has two halves:

1. Keep what is valid (``scheduler.keep``): current placements go only with a
   reason, so a second round over the result with nothing changed keeps
   everything and does nothing.
2. Place what is missing: per model in ``demands`` order, replica slots
   ascending, each trying the model's profiles from highest priority down;
   the first profile that fits somewhere wins, on its best-fitting node(s)
   (``scheduler.capacity``). What fits nowhere is explained
   (``scheduler.explain``).

Cost: O(C log C + N log N) for C current placements and N nodes when nothing
changed; plus O(L log N) per new single-node replica (L: distinct free-GPU
counts, a handful), O(F) per new multi-node one (F: nodes that fit), and O(N)
per distinct profile that fits nowhere, paid once for its explanation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from itertools import count, islice

from catalog.views import PlacementProfile
from scheduler.capacity import Capacity
from scheduler.explain import ClassIndex, ProfileRejections, count_rejections, render
from scheduler.fit import selector_key
from scheduler.inventory import Node
from scheduler.keep import keep_current
from scheduler.lifecycle import Lifecycle
from scheduler.placements import Demand, Placement, Plan, Removal, Unplaced
from scheduler.rollout import finish, judge
from scheduler.staleness import DEFAULT_STALENESS, Freshness, StalenessPolicy, freshness

# Everything about a profile that decides where it fits (not its name).
_Requirement = tuple[str | None, tuple[tuple[str, str], ...], int, int, int]
# A profile to try, with its requirement worked out once per model.
_Option = tuple[PlacementProfile, _Requirement]


def plan(
    demands: Sequence[Demand],
    nodes: Sequence[Node],
    current: Sequence[Placement],
    now: datetime,
    policy: StalenessPolicy = DEFAULT_STALENESS,
    *,
    lifecycle: Lifecycle | None = None,
) -> Plan:
    """Decide which replicas to keep, start and stop, and explain what cannot run.

    ``lifecycle`` adds replica states, cordons and failure back-offs
    (``scheduler.rollout`` says what they change).

    Raises ValueError for inputs no round can make sense of: a naive ``now``,
    two nodes with one name, or one model demanded twice.
    """
    if now.tzinfo is None:
        raise ValueError(f"now {now} has no time zone; pass the current time in UTC")
    _refuse_twice_demanded(demands)
    inventory = _index_nodes(nodes)
    state = {name: freshness(n.reported_at, now, policy) for name, n in inventory.items()}
    fresh = frozenset(name for name, f in state.items() if f is Freshness.FRESH)
    lifecycle = lifecycle or Lifecycle()
    judged = judge(demands, current, lifecycle, inventory=inventory, state=state, now=now)
    closed = lifecycle.closed_nodes & fresh
    # Cordoned and draining nodes take nothing new; what runs there stays (or drains).
    capacity = Capacity(nodes, fresh - closed)
    for held in judged.held:
        capacity.consume(held.nodes, held.gpus_per_node, held.memory_gb_per_node)

    kept = keep_current(
        judged.current,
        demands=judged.demands,
        inventory=inventory,
        state=state,
        capacity=capacity,
        now=now,
        policy=policy,
    )
    placed, failed = _place_missing(
        judged.demands,
        kept.placements,
        capacity,
        held=judged.held,
        reserved=judged.reserved,
        avoid=judged.avoid,
    )
    unplaced = _explain(failed, inventory, fresh, capacity, closed=closed, avoid=judged.avoid)

    result = Plan(
        keep=tuple(sorted(kept.placements, key=_slot_order)),
        place=tuple(sorted(placed, key=_slot_order)),
        # Within a model, highest replica first: the order surplus replicas go in.
        remove=tuple(sorted(judged.removals + kept.removals, key=_removal_order)),
        unplaced=unplaced,
        mass_loss=kept.mass_loss,
        lost_nodes=tuple(sorted(kept.lost_nodes)),
    )
    return finish(result, judged, lifecycle)


def _place_missing(
    demands: Sequence[Demand],
    kept: Iterable[Placement],
    capacity: Capacity,
    *,
    held: Iterable[Placement] = (),
    reserved: Mapping[str, set[int]] | None = None,
    avoid: Mapping[str, frozenset[str]] | None = None,
) -> tuple[list[Placement], dict[str, tuple[list[_Option], list[int]]]]:
    """Fill every empty replica slot that fits; return the rest by model, with what was tried.

    ``held`` replicas (old ones a rollout keeps running) occupy their slots
    without counting towards the model's replicas, and so do ``reserved`` slots
    (old ones removed this round); ``avoid`` holds, per model, the nodes it
    backs off from.
    """
    avoid = avoid or {}
    occupied: dict[str, set[int]] = {}
    for placement in kept:
        occupied.setdefault(placement.model, set()).add(placement.replica)
    counted = {model: len(slots) for model, slots in occupied.items()}
    for placement in held:
        occupied.setdefault(placement.model, set()).add(placement.replica)
    for model, slots in (reserved or {}).items():
        occupied.setdefault(model, set()).update(slots)
    # Capacity only shrinks from here on, so a requirement that found no room
    # once will find none for the rest of the round: don't search again.
    no_room: set[_Requirement] = set()
    placed: list[Placement] = []
    failed: dict[str, tuple[list[_Option], list[int]]] = {}
    for demand in demands:
        taken = occupied.get(demand.model, set())
        options = _options(demand.profiles)
        # The lowest free slots, as many as are missing (slots need not be
        # contiguous: a running replica keeps the slot it has).
        missing = max(demand.replicas, 0) - counted.get(demand.model, 0)
        free_slots = (slot for slot in count() if slot not in taken)
        avoided = avoid.get(demand.model, frozenset())
        fingerprints = demand.lifecycle.fingerprints if demand.lifecycle else {}
        for replica in islice(free_slots, max(missing, 0)):
            new = _place_one(
                demand.model,
                replica,
                options,
                capacity,
                no_room,
                avoid=avoided,
                fingerprints=fingerprints,
            )
            if new is None:
                failed.setdefault(demand.model, (options, []))[1].append(replica)
            else:
                placed.append(new)
    return placed, failed


def _place_one(
    model: str,
    replica: int,
    options: list[_Option],
    capacity: Capacity,
    no_room: set[_Requirement],
    *,
    avoid: frozenset[str] = frozenset(),
    fingerprints: Mapping[str, str] | None = None,
) -> Placement | None:
    """Place one replica with the first profile that fits, consuming its capacity."""
    for profile, requirement in options:
        if requirement in no_room:
            continue
        if profile.nodes > 1:
            chosen = capacity.best_gang(profile, avoid)
        else:
            best = capacity.best_node(profile, avoid)
            chosen = None if best is None else (best,)
        if chosen is None:
            if not avoid:  # no room for one model's back-off is not no room for all
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
            fingerprint=(fingerprints or {}).get(profile.name, ""),
        )
    return None


def _explain(
    failed: dict[str, tuple[list[_Option], list[int]]],
    inventory: Mapping[str, Node],
    fresh: frozenset[str],
    capacity: Capacity,
    *,
    closed: frozenset[str] = frozenset(),
    avoid: Mapping[str, frozenset[str]] | None = None,
) -> tuple[Unplaced, ...]:
    """One explanation per model, shared by its unplaced replicas.

    Explained against the capacity left at the end of the round: a profile
    that found no room earlier finds none now either, and "why not now" is the
    question an operator asks.
    """
    nodes = list(inventory.values())
    index = ClassIndex.of(nodes, fresh, closed)
    counted: dict[tuple[str, _Requirement, frozenset[str]], ProfileRejections] = {}
    unplaced: list[Unplaced] = []
    for model, (options, replicas) in failed.items():
        rejections = []
        avoided = (avoid or {}).get(model, frozenset())
        for profile, requirement in options:
            key = (profile.name, requirement, avoided)
            if key not in counted:
                counted[key] = count_rejections(
                    profile,
                    nodes,
                    fresh=fresh,
                    capacity=capacity,
                    index=index,
                    closed=closed,
                    avoid=avoided,
                )
            rejections.append(counted[key])
        reason = render(rejections) or "the model has no profiles to place it with"
        unplaced.extend(Unplaced(model, r, reason, tuple(rejections)) for r in replicas)
    return tuple(sorted(unplaced, key=lambda u: (u.model, u.replica)))


def _options(profiles: Sequence[PlacementProfile]) -> list[_Option]:
    """A model's profiles in the order to try them, each with its requirement.

    Highest priority first; equal priorities keep declaration order (the sort
    is stable).
    """
    return [
        (
            p,
            (p.gpu_class, selector_key(p.node_selector), p.gpus_per_node, p.min_memory_gb, p.nodes),
        )
        for p in sorted(profiles, key=lambda p: -p.priority)
    ]


def _index_nodes(nodes: Sequence[Node]) -> dict[str, Node]:
    inventory: dict[str, Node] = {}
    for node in nodes:
        if node.name in inventory:
            raise ValueError(
                f'node "{node.name}" appears twice in the inventory; each node reports once'
            )
        inventory[node.name] = node
    return inventory


def _refuse_twice_demanded(demands: Sequence[Demand]) -> None:
    seen: set[str] = set()
    for demand in demands:
        if demand.model in seen:
            raise ValueError(
                f'model "{demand.model}" is demanded twice; merge its demands into one'
            )
        seen.add(demand.model)


def _removal_order(removal: Removal) -> tuple[str, int, str]:
    return removal.placement.model, -removal.placement.replica, removal.reason


def _slot_order(placement: Placement) -> tuple[str, int]:
    return placement.model, placement.replica
