"""The placement planner: (demands, inventory, current placements, now) -> plan.

Pure: no I/O, no clock (``now`` is given), no randomness, and no dependence on
the order of ``nodes`` or ``current``. The same inputs give the same plan
(ARCHITECTURE invariant 5), which is what makes a round replayable when
someone asks later why a replica went where it went. ``demands`` order only
breaks ties: models claim hardware by priority, then largest replicas first
(``scheduler.planner.order``).

A round has three parts:

1. Keep what is valid (``scheduler.planner.survivors``): current placements go only with a
   reason, so a second round over the result with nothing changed keeps
   everything and does nothing.
2. Place what is missing (``scheduler.planner.packing``): per model in placement
   order, replica slots ascending, each trying the model's profiles from
   highest priority down; the first profile that fits somewhere wins, on the
   node(s) chosen for spread, then best fit (``scheduler.planner.spread``). If that
   leaves a replica unplaced, plain best fit and first fit are tried on the
   same free capacity and the one placing the most GPUs is kept. Then the
   new replicas are spread by same-shape swaps and moves into free room
   (``scheduler.planner.spread_repair``), which keep the GPU count.
3. Preempt (``scheduler.planner.preemption``, unless the policy turns it off): a replica
   still unplaced may evict replicas of strictly lower priority.
4. Defragment (``scheduler.planner.defrag``, unless the policy turns it off): a replica
   still unplaced whose room exists in total makes room by moving the fewest replicas
   of equal or lower priority, surge-first, within their disruption budgets; with
   nothing to place, a model that opted in has a worsened spread repaired. What fits
   nowhere is explained (``scheduler.planner.fleet.rejections``), and each model's resilience
   is computed (``scheduler.planner.resilience``).

Cost: O(C log C + N log N) for C current placements and N nodes when nothing
changed (resilience adds about O(C)); plus O(L log N) per new single-node
replica (L: distinct free-GPU counts, a handful), O(F) per new multi-node one
(F: nodes that fit), and O(N) per distinct profile that fits nowhere, paid
once for its explanation; three times the placing when a baseline is tried.
A round whose inputs did not change (report times aside) need not be planned
at all: ``scheduler.planner.rounds.incremental`` (what the daemon runs) returns the plan
of the round before at the cost of what changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from operator import attrgetter

from scheduler.lifecycle.inputs import Lifecycle
from scheduler.lifecycle.staleness import DEFAULT_STALENESS, Freshness, StalenessPolicy
from scheduler.planner.defrag import IndexMemo, defragment
from scheduler.planner.fleet.capacity import Capacity, PoolMemo
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement, Plan, Removal, Unplaced
from scheduler.planner.fleet.rejections import (
    ClassIndex,
    ProfileRejections,
    RejectionMemo,
    count_rejections,
    render,
)
from scheduler.planner.packing import Option, Requirement, place_missing
from scheduler.planner.preemption import Preempted, preempt
from scheduler.planner.readoption import readopt
from scheduler.planner.resilience import ResilienceMemo, resilience
from scheduler.planner.rollout import JudgeMemo, finish, judge
from scheduler.planner.spread import Spread, SpreadMemo
from scheduler.planner.spread_repair import repair
from scheduler.planner.survivors import KeepMemo, keep_current


@dataclass(slots=True)
class Carried:
    """What one round's planning leaves for the next to start from (``IncrementalRounds``
    keeps one): the parts of a round whose inputs did not change are taken from it, the
    rest computed, and each part reused only where it is provably what computing it again
    gives (``survivors.KeepMemo`` says how), so the plan is ``plan``'s without it.

    ``inventory``: a version of the nodes' content (every field but the report time),
    which the caller moves whenever a node is added, forgotten or reported changed;
    None when unknown (nothing that reads the nodes' content is reused)."""

    inventory: object = None
    keep: KeepMemo = field(default_factory=KeepMemo)
    pools: PoolMemo = field(default_factory=PoolMemo)
    spread: SpreadMemo = field(default_factory=SpreadMemo)
    index: IndexMemo = field(default_factory=IndexMemo)
    judged: JudgeMemo = field(default_factory=JudgeMemo)
    rejections: RejectionMemo = field(default_factory=RejectionMemo)
    resilience: ResilienceMemo = field(default_factory=ResilienceMemo)
    explained: ExplainMemo = field(default_factory=lambda: ExplainMemo())  # noqa: PLW0108


# A model's explanation as a round made it: its unplaced replicas, each one's note (None
# for none) and the model's reason (``_explain``'s key), its rejection counts, and the
# ``Unplaced`` made of them.
_Explained = tuple[
    tuple[tuple[int, ...], tuple[str | None, ...], str],
    tuple[ProfileRejections, ...],
    list[Unplaced],
]


@dataclass(slots=True)
class ExplainMemo:
    """Each model's unplaced replicas as the round before explained them, taken again when
    this round's explanation of the model is the same: the same replicas, notes and reason
    and equal counts (an ``Unplaced`` holds those alone). A round that plans at 100,000
    nodes leaves some 30,000 replicas unplaced and a lost node changes one model's: the
    others' are the round before's objects, not 30,000 made again (and walked by the
    cycle collector at the round's end). Held by ``Carried``."""

    by_model: dict[str, _Explained] = field(default_factory=dict)
    reused: int = 0


def plan(
    demands: Sequence[Demand],
    nodes: Sequence[Node],
    current: Sequence[Placement],
    now: datetime,
    policy: StalenessPolicy = DEFAULT_STALENESS,
    *,
    lifecycle: Lifecycle | None = None,
    carried: Carried | None = None,
) -> Plan:
    """Decide which replicas to keep, start and stop, and explain what cannot run.

    ``lifecycle`` adds replica states, cordons and failure back-offs
    (``scheduler.planner.rollout`` says what they change). ``carried``: the round
    before's work (``Carried``), used and updated; the plan is the same without it.

    Raises ValueError for inputs no round can make sense of: a naive ``now``,
    two nodes with one name, or one model demanded twice.
    """
    if now.tzinfo is None:
        raise ValueError(f"now {now} has no time zone; pass the current time in UTC")
    _refuse_twice_demanded(demands)
    inventory = _index_nodes(nodes)
    # ``freshness`` for every node, as two comparisons: age <= limit is
    # reported_at >= now - limit, exactly (datetimes count whole microseconds).
    fresh_from = now - policy.stale_after
    stale_from = fresh_from - policy.grace
    state = {
        name: Freshness.FRESH
        if n.reported_at >= fresh_from
        else Freshness.STALE
        if n.reported_at >= stale_from
        else Freshness.LOST
        for name, n in inventory.items()
    }
    fresh = frozenset(name for name, f in state.items() if f is Freshness.FRESH)
    lifecycle = lifecycle or Lifecycle()
    judged = judge(
        demands,
        current,
        lifecycle,
        inventory=inventory,
        state=state,
        now=now,
        memo=None if carried is None else carried.judged,
    )
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
        memo=None if carried is None else carried.keep,
        inventory_version=None if carried is None else carried.inventory,
        fresh=fresh,
    )
    if carried is not None:
        # Every pool from here on is the round before's, patched (``PoolMemo``).
        capacity.settle(carried.pools, carried.inventory)
    # A node given up and back: its replicas placed again where their engines still run
    # (``scheduler.planner.readoption``), before anything new is placed.
    readopted = readopt(
        judged.demands,
        kept.placements,
        lifecycle,
        capacity,
        fresh=fresh,
        taken={
            *((p.model, p.replica) for p in judged.held),
            *((m, r) for m, rs in judged.reserved.items() for r in rs),
        },
    )
    if readopted.placements:
        gone = {(r.placement.model, r.placement.replica) for r in readopted.removals}
        kept = replace(
            kept,
            placements=[
                *(p for p in kept.placements if (p.model, p.replica) not in gone),
                *readopted.placements,
            ],
            removals=[*kept.removals, *readopted.removals],
        )
    again = {(p.model, p.replica) for p in readopted.placements}
    spread = (
        Spread.of(judged.demands, inventory, kept.placements)
        if carried is None
        else carried.spread.of(judged.demands, inventory, kept.placements, carried.inventory)
    )
    attempt = place_missing(
        judged.demands,
        kept.placements,
        capacity,
        spread,
        held=judged.held,
        reserved=judged.reserved,
        avoid=judged.avoid,
    )
    # Held replicas (the old side of a rollout) are not candidates: they are not
    # among kept.placements, only their capacity is consumed.
    preempted = Preempted(kept=kept.placements)
    if policy.preemption:
        preempted = preempt(judged.demands, attempt, kept.placements)
    # Whichever way won, the new replicas are then spread by same-shape swaps and
    # moves into free room, which never change the GPU count (``spread_repair``).
    repaired = repair(
        judged.demands,
        attempt.placed,
        attempt.spread,
        attempt.capacity,
        eligible=attempt.eligible_nodes,
        avoid=judged.avoid,
        fixed=preempted.preemptors,
        unplaced={m: [p for p, _ in tried] for m, (tried, _) in attempt.failed.items()},
    )
    attempt.placed = repaired.placed
    kept_now = preempted.kept
    moved = None
    if policy.defragment:
        # 4. Defragment (``scheduler.planner.defrag``): make room for an unplaced replica by
        # moving replicas of equal or lower priority, surge-first; or repair a spread.
        moved = defragment(
            judged.demands,
            {m: [p for p, _ in tried] for m, (tried, _) in attempt.failed.items()},
            kept_now,
            [*attempt.placed, *judged.held],
            attempt.capacity,
            lifecycle=lifecycle,
            inventory=inventory,
            reserved=judged.reserved,
            rolling={p.model for p in judged.held if not p.moving},
            avoid=judged.avoid,
            repair_all_spreads=policy.repair_spread,
            memo=None if carried is None else carried.index,
            inventory_version=None if carried is None else carried.inventory,
        )
        kept_now = moved.keep
        attempt.placed.extend(m.copy for m in moved.moves if m.copy is not None)
    notes = {
        **{
            (m, r): n
            for m, (_, rs) in attempt.failed.items()
            if (n := attempt.notes.get(m))
            for r in rs
        },
        **attempt.replica_notes,
    }
    unplaced = _explain(
        attempt.failed,
        inventory,
        fresh,
        attempt.capacity,
        notes,
        closed=closed,
        avoid=judged.avoid,
        after=moved.notes if moved is not None else {},
        memo=None if carried is None else carried.rejections,
        inventory_version=None if carried is None else carried.inventory,
        explained=None if carried is None else carried.explained,
    )
    # Placed again where they run: new rows for the store, though kept through the round.
    # (Nothing placed again, the usual case: no pass over every kept replica to ask.)
    keep = tuple(
        sorted(
            (p for p in kept_now if (p.model, p.replica) not in again) if again else kept_now,
            key=_slot_order,
        )
    )
    place = tuple(
        sorted(
            [*attempt.placed, *(p for p in kept_now if (p.model, p.replica) in again)]
            if again
            else attempt.placed,
            key=_slot_order,
        )
    )

    result = Plan(
        keep=keep,
        place=place,
        # Within a model, highest replica first: the order surplus replicas go in.
        remove=tuple(
            sorted(judged.removals + kept.removals + preempted.evicted, key=_removal_order)
        ),
        unplaced=unplaced,
        mass_loss=kept.mass_loss,
        lost_nodes=tuple(sorted(kept.lost_nodes)),
        strategy=attempt.strategy.value,
        # The old side of a rollout serves too, so it counts towards resilience.
        resilience=resilience(
            demands,
            keep + place + tuple(judged.held),
            inventory,
            memo=None if carried is None else carried.resilience,
            inventory_version=None if carried is None else carried.inventory,
        ),
    )
    result = finish(result, judged, lifecycle)
    if moved is not None:
        result = replace(
            result,
            moves=tuple(moved.moves),
            moving=tuple(p for p in result.keep if p.moving),
        )
    if repaired.notes:
        result = replace(result, notes=result.notes + tuple(repaired.notes))
    if readopted.notes:
        placed_now = {(p.model, p.replica, p.nodes) for p in result.place}
        result = replace(
            result,
            notes=result.notes + readopted.notes,
            again=tuple(
                c for c in readopted.copies if (c.model, c.replica, (c.node,)) in placed_now
            ),
        )
    return result


def _explain(
    failed: dict[str, tuple[list[Option], list[int]]],
    inventory: Mapping[str, Node],
    fresh: frozenset[str],
    capacity: Capacity,
    notes: Mapping[tuple[str, int], str],
    *,
    closed: frozenset[str] = frozenset(),
    avoid: Mapping[str, frozenset[str]] | None = None,
    after: Mapping[str, str] | None = None,
    memo: RejectionMemo | None = None,
    inventory_version: object = None,
    explained: ExplainMemo | None = None,
) -> tuple[Unplaced, ...]:
    """One explanation per model, shared by its unplaced replicas.

    Explained against the capacity left at the end of the round: a profile
    that found no room earlier finds none now either, and "why not now" is the
    question an operator asks. With a ``memo``, the counts are the round before's,
    recounted at the nodes that changed (``RejectionMemo``): the same counts. With
    ``explained``, a model explained as the round before is its objects (``ExplainMemo``).
    """
    nodes = list(inventory.values())
    if memo is not None:
        if failed:
            gpus, memory = capacity.free_state()
            memo.advance(
                inventory_version, nodes, fresh=fresh, closed=closed, gpus=gpus, memory=memory
            )
        index = None
    else:
        index = ClassIndex.of(nodes, fresh, closed)
    counted: dict[tuple[str, Requirement, frozenset[str]], ProfileRejections] = {}
    unplaced: list[Unplaced] = []
    made: dict[str, _Explained] = {}
    for model, (options, replicas) in failed.items():
        rejections = []
        avoided = (avoid or {}).get(model, frozenset())
        for profile, requirement in options:
            key = (profile.name, requirement, avoided)
            if key not in counted and memo is not None:
                counted[key] = memo.count(key, profile, nodes, capacity=capacity, avoid=avoided)
            elif key not in counted:
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
        if after and model in after:
            reason = f"{reason}; {after[model]}"
        # A required spread or an eviction is why, not only the counts. One tuple of the
        # counts for all of a model's replicas (immutable: at 100,000 nodes a round may
        # leave 30,000 replicas unplaced, and a tuple each was 30,000 more objects).
        shared = tuple(rejections)
        said = (tuple(replicas), tuple(notes.get((model, r)) for r in replicas), reason)
        before = None if explained is None else explained.by_model.get(model)
        if explained is not None and before is not None and before[:2] == (said, shared):
            made[model] = before
            explained.reused += 1
        else:
            made[model] = (said, shared, _unplaced(model, said, shared))
        unplaced.extend(made[model][2])
    if explained is not None:
        explained.by_model = made
    return tuple(sorted(unplaced, key=_slot_order))


def _unplaced(
    model: str,
    key: tuple[tuple[int, ...], tuple[str | None, ...], str],
    shared: tuple[ProfileRejections, ...],
) -> list[Unplaced]:
    """A model's unplaced replicas: each with its note, if any, before the model's reason."""
    replicas, noted, reason = key
    return [
        Unplaced(model, r, reason if note is None else f"{note}; {reason}", shared)
        for r, note in zip(replicas, noted, strict=True)
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


# (model, replica), read in C: sorting thousands of kept placements is part of every round.
_slot_order = attrgetter("model", "replica")
