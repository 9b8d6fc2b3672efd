"""Why each replica of a model went where it did in a recorded round, planned again.

Pure: a recorded round holds exactly what its plan was made from (catalog,
inventory, report times, placements before it, time, policy), so planning
again gives the same plan (invariant 5). This module does that and turns the
result for one model into statements an on-call engineer can act on. For a
replica that runs on a lower-priority profile, it says why each better profile
was passed over, counted against the capacity left at the end of the round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from catalog import Catalog
from catalog.definition.views import PlacementProfile
from scheduler.lifecycle.inputs import Lifecycle
from scheduler.lifecycle.staleness import Freshness, StalenessPolicy, freshness
from scheduler.planner.demands import demands
from scheduler.planner.fleet.capacity import Capacity
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Placement, Plan
from scheduler.planner.fleet.rejections import count_rejections, render
from scheduler.planner.plan import plan as make_plan


@dataclass(frozen=True, slots=True)
class ReplicaStory:
    replica: int
    outcome: str  # "kept", "placed", "removed", "unplaced"
    profile: str | None
    nodes: tuple[str, ...]
    why: str


@dataclass(frozen=True, slots=True)
class Explanation:
    model: str
    plan: Plan
    stories: tuple[ReplicaStory, ...]
    # The lifecycle's lines about the model: nodes it backs off from, its rollout.
    notes: tuple[str, ...] = ()


def explain(
    model: str,
    *,
    catalog: Catalog,
    nodes: Sequence[Node],
    current: Sequence[Placement],
    now: datetime,
    policy: StalenessPolicy,
    lifecycle: Lifecycle | None = None,
    counts: Mapping[str, int] | None = None,
) -> Explanation:
    """Plan the round again and tell the story of each replica of ``model``; ``counts``
    are the autoscaler's replica counts in force then (``demands``)."""
    wanted = catalog.resolve(model)
    lifecycle = lifecycle or Lifecycle()
    result = make_plan(demands(catalog, counts), nodes, current, now, policy, lifecycle=lifecycle)
    fresh = frozenset(
        n.name for n in nodes if freshness(n.reported_at, now, policy) is Freshness.FRESH
    )
    closed = lifecycle.closed_nodes & fresh
    avoided = frozenset(lifecycle.avoided(now).get(wanted.name if wanted else model, {}))
    end = Capacity(nodes, fresh - closed)
    for p in result.placements:
        end.consume(p.nodes, p.gpus_per_node, p.memory_gb_per_node)

    name = wanted.name if wanted is not None else model
    stories: list[ReplicaStory] = []
    placed = {p.replica for p in result.place if p.model == name}
    for p in result.placements:
        if p.model != name:
            continue
        outcome = "placed" if p.replica in placed else "kept"
        why = (
            _why_placed(result, name, p.replica)
            if outcome == "placed"
            else "already running and still valid; running replicas are not moved without a reason"
        )
        copy_of = next(
            (
                m
                for m in result.moves
                if m.copy is not None and m.copy.replica == p.replica and m.copy.model == name
            ),
            None,
        )
        if copy_of is not None:
            why = (
                f"placed as the new copy of replica {copy_of.placement.replica} (surge-first: "
                f"it stops once this one is ready), {copy_of.reason}"
            )
        elif p.moving:
            outcome = "moving"
            why = (
                f"being moved, surge-first, {p.moving}: it runs until its copy is ready and "
                "the model has all its wanted replicas ready without it"
            )
        if wanted is not None:
            better = _passed_over(wanted.placement_profiles(), p.profile)
            if better:
                reasons = render(
                    [
                        count_rejections(
                            b, nodes, fresh=fresh, capacity=end, closed=closed, avoid=avoided
                        )
                        for b in better
                    ]
                )
                why += f"; better profiles did not fit: {reasons}"
        stories.append(ReplicaStory(p.replica, outcome, p.profile, p.nodes, why))
    for r in result.remove:
        if r.placement.model == name:
            stories.append(
                ReplicaStory(
                    r.placement.replica, "removed", r.placement.profile, r.placement.nodes, r.reason
                )
            )
    for u in result.unplaced:
        if u.model == name:
            stories.append(ReplicaStory(u.replica, "unplaced", None, (), u.reason))
    stories.sort(key=lambda s: (s.replica, s.outcome != "removed"))
    return Explanation(name, result, tuple(stories), lifecycle_notes(result, name))


def lifecycle_notes(result: Plan, model: str) -> tuple[str, ...]:
    """What the lifecycle adds to a model's story: back-offs and its rollout."""
    notes = [note for m, note in result.notes if m == model]
    for r in result.rollouts:
        if r.model == model:
            notes.append(
                f"rollout ({r.cause}): {len(r.old)} old, {len(r.new)} new; "
                + (r.waiting or "every old replica is replaced")
            )
    return tuple(notes)


def _why_placed(result: Plan, model: str, replica: int) -> str:
    if result.strategy == "policy":
        why = (
            "placed with the highest-priority profile that fit, on the node(s) holding the "
            "fewest of its replicas (spread), best fit among those"
        )
    else:
        why = (
            f"placed by {result.strategy}, which placed more GPUs this round than the planner's "
            "own order (priority, largest replicas first, spread) on the same free capacity"
        )
    # A replica the spread repair moved says so (``scheduler.planner.spread_repair``): it is not
    # where the way above put it.
    moved = [n for m, n in result.notes if m == model and n.startswith(f"replica {replica} moved")]
    if moved:
        why += "; then " + "; then ".join(n.removeprefix(f"replica {replica} ") for n in moved)
    mark = f"preempted by {model}[{replica}]"
    victims = sorted(
        f"{r.placement.model}[{r.placement.replica}]" for r in result.remove if r.reason == mark
    )
    if victims:
        why += f"; made room by evicting {', '.join(victims)} (lower priority)"
    return why


def _passed_over(profiles: Sequence[PlacementProfile], chosen: str) -> list[PlacementProfile]:
    """The profiles tried before ``chosen``: higher priority, or equal and declared earlier.

    The planner tries profiles in this order (a stable sort keeps declaration
    order among equals), so these are exactly the ones that did not fit.
    """
    out: list[PlacementProfile] = []
    for p in sorted(profiles, key=lambda p: -p.priority):
        if p.name == chosen:
            return out
        out.append(p)
    return []
