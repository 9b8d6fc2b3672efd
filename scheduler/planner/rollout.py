"""The replica lifecycle inside a round: failures, startup timeouts, back-offs, rollouts.

Pure, like the planner it serves: the states, cordons and failure records are
inputs (``scheduler.lifecycle.inputs.Lifecycle``), recorded with the round.

Before the planner keeps and places, ``judge`` goes through the current
placements:

- A replica its agent reported failed, or not ready within its profile's
  ``startup_timeout`` after it was placed, is removed and counted as a failure
  of its model on its nodes; those nodes are then avoided for that model with
  a growing back-off, starting this round.
- A replica whose recorded fingerprint differs from its profile's (the
  definition changed what it runs), or on a draining node, is *old*. Old
  replicas are held (they keep running and keep their capacity) while new
  ones are placed beside them, at most ``max_surge`` beyond the wanted count;
  an old replica is removed only while the model keeps ``scaling.min -
  max_unavailable`` ready replicas without it. A not-ready old replica serves
  nobody and goes first.

After the planner, ``finish`` turns an unplaced surge replica into what the
rollout waits for (the model is not short of anything: its old replicas run)
and tells each rollout's progress.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from catalog import Model
from catalog.changes.digest import model_version
from catalog.definition.model import Profile
from scheduler.lifecycle.inputs import DEFAULT_STARTUP_TIMEOUT, Lifecycle, ModelLifecycle
from scheduler.lifecycle.replica_reports import FAILED, PLACED, READY, STARTING, ReplicaStatus
from scheduler.lifecycle.staleness import Freshness, format_age
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import (
    Demand,
    Failure,
    Placement,
    Plan,
    Removal,
    RolloutProgress,
    Unplaced,
    same_objects,
)


def fingerprint(model: Model, profile: Profile) -> str:
    """What a replica of ``profile`` runs: weights, engine, its arguments and environment,
    parallelism and hardware shape. Equal fingerprints, nothing to roll out."""
    content = {
        "source": model.source,
        "engine": profile.engine,
        "args": list(profile.args),
        # A secret by reference counts by its name: the value is the node's, not ours.
        "env": {
            k: v if isinstance(v, str) else v.model_dump() for k, v in sorted(profile.env.items())
        },
        "tp": profile.tp,
        "pp": profile.pp,
        "nodes": profile.nodes,
        "gpus_per_node": profile.gpus_per_node,
        "gpu_class": profile.gpu_class,
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:32]


def model_lifecycle(model: Model) -> ModelLifecycle:
    return ModelLifecycle(
        fingerprints={p.name: fingerprint(model, p) for p in model.profiles},
        startup_timeouts={p.name: p.startup_timeout for p in model.profiles},
        max_surge=model.rollout.max_surge,
        max_unavailable=model.rollout.max_unavailable,
        version=model_version(model),
        min_ready=model.scaling.min,
        movable=model.disruption.movable,
        max_moving=model.disruption.max_unavailable,
        repair_spread=model.disruption.repair_spread,
    )


@dataclass(slots=True)
class _Rolling:
    wanted: int
    causes: list[str]
    held: list[Placement]
    max_unavailable: int


@dataclass(slots=True)
class Judged:
    """What ``judge`` decided, for the planner to continue from."""

    current: list[Placement] = field(default_factory=list)  # for keep_current
    held: list[Placement] = field(default_factory=list)
    removals: list[Removal] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    demands: list[Demand] = field(default_factory=list)
    avoid: dict[str, frozenset[str]] = field(default_factory=dict)
    notes: list[tuple[str, str]] = field(default_factory=list)
    rolling: dict[str, _Rolling] = field(default_factory=dict)
    # Slots of old replicas removed this round, not to be refilled this round: an
    # agent's report written against the old placement would otherwise land on
    # the new one in the same slot (and, on the same node, be taken for its state).
    reserved: dict[str, set[int]] = field(default_factory=dict)


def _status(lifecycle: Lifecycle, p: Placement) -> ReplicaStatus | None:
    return lifecycle.statuses.get((p.model, p.replica))


def _ready(lifecycle: Lifecycle, p: Placement) -> bool:
    status = _status(lifecycle, p)
    # No status at all: a placement from before replica states; it counts as ready.
    return status is None or status.counts_as_ready


@dataclass(slots=True)
class JudgeMemo:
    """The round before's judgement, for a round judging the same placements, demands and
    lifecycle (the same objects). ``judge`` reads the time only for a replica reported
    placed or starting (its startup timeout), a failure (its back-off ends) and the
    failure records' back-offs (``Lifecycle.avoided``), and the nodes' freshness only for
    a replica with a cause to be old (``_alive``): a judgement with none of the first
    three, no replica with such a cause (alive or not), and the same records avoided now
    is what judging again gives. Held by ``plan``'s ``carried``."""

    current: list[Placement] = field(default_factory=list)
    demands: list[Demand] = field(default_factory=list)
    lifecycle: Lifecycle | None = None
    avoided: object = None
    judged: Judged | None = None
    hits: int = 0


def judge(
    demands: Sequence[Demand],
    current: Sequence[Placement],
    lifecycle: Lifecycle,
    *,
    inventory: Mapping[str, Node],
    state: Mapping[str, Freshness],
    now: datetime,
    memo: JudgeMemo | None = None,
) -> Judged:
    """The current placements judged (see module); ``memo``: the round before's, reused
    when it provably holds (``JudgeMemo``) and updated."""
    if memo is not None:
        avoided = lifecycle.avoided(now) if lifecycle.failures else None
        known = memo.judged
        if (
            known is not None
            and memo.lifecycle is lifecycle
            and memo.avoided == avoided
            and same_objects(memo.current, current)
            and same_objects(memo.demands, demands)
        ):
            memo.hits += 1
            return _copied(known)
        out, timed = _judge(demands, current, lifecycle, inventory=inventory, state=state, now=now)
        steady = not (timed or out.failures or out.rolling or out.held or out.removals)
        memo.current, memo.demands, memo.lifecycle = list(current), list(demands), lifecycle
        memo.avoided, memo.judged = avoided, _copied(out) if steady else None
        return out
    return _judge(demands, current, lifecycle, inventory=inventory, state=state, now=now)[0]


def _copied(judged: Judged) -> Judged:
    """A judgement whose lists and maps the caller may change without changing this one."""
    return Judged(
        current=list(judged.current),
        held=list(judged.held),
        removals=list(judged.removals),
        failures=list(judged.failures),
        demands=list(judged.demands),
        avoid=dict(judged.avoid),
        notes=list(judged.notes),
        rolling=dict(judged.rolling),
        reserved={m: set(r) for m, r in judged.reserved.items()},
    )


def _judge(
    demands: Sequence[Demand],
    current: Sequence[Placement],
    lifecycle: Lifecycle,
    *,
    inventory: Mapping[str, Node],
    state: Mapping[str, Freshness],
    now: datetime,
) -> tuple[Judged, bool]:
    """``judge``, and whether it read the time for a replica's startup timeout or the
    nodes' freshness for an old replica (then it is not reused: ``JudgeMemo``)."""
    out = Judged()
    timed = False
    by_model = {d.model: d for d in demands}
    draining = lifecycle.draining_nodes
    old: dict[str, list[tuple[Placement, str]]] = {}
    for stored in sorted(current, key=lambda p: (p.model, p.replica, p.nodes)):
        p = stored
        demand = by_model.get(p.model)
        spec = demand.lifecycle if demand is not None else None
        status = _status(lifecycle, p)
        if demand is not None and status is not None and status.reported:
            timed = timed or status.state in (PLACED, STARTING)
            failure = _failure(p, status, spec, now)
            if failure is not None:
                reason, removal = failure
                out.failures.append(Failure(p, reason))
                out.removals.append(Removal(p, removal))
                continue
        if spec is not None and not p.fingerprint and p.profile in spec.fingerprints:
            # Placed before fingerprints were recorded: take what its profile runs
            # now as what it runs, so that the next change rolls it like any other.
            p = replace(p, fingerprint=spec.fingerprints[p.profile])
        if (
            spec is not None
            and not p.version
            and spec.version
            and p.fingerprint == spec.fingerprints.get(p.profile)
        ):
            # Placed before versions were recorded, running what the model runs now:
            # pin it to the current version, whose engine view it already runs.
            p = replace(p, version=spec.version)
        cause = _old_because(p, spec, draining)
        # An old replica is judged by its nodes' freshness too (``_alive``).
        timed = timed or (demand is not None and cause is not None)
        if demand is not None and cause is not None and _alive(p, inventory, state):
            old.setdefault(p.model, []).append((p, cause))
        else:
            out.current.append(p)
    _avoid(out, lifecycle, now)
    _keep_clear(out, old, demands)
    out.demands = [_roll(d, old[d.model], out, lifecycle) if d.model in old else d for d in demands]
    return out, timed


def _keep_clear(
    out: Judged, old: Mapping[str, list[tuple[Placement, str]]], demands: Sequence[Demand]
) -> None:
    """While replicas move (``scheduler.planner.defrag``), the node they leave takes no new
    replica of their own model (its copy must land elsewhere) and, when the move makes
    room for a model, no new replica of any other model either: the room is its."""
    clearing: dict[str, str] = {}
    for model, olds in old.items():
        leaving = frozenset(n for p, _ in olds if p.moving for n in p.nodes)
        if leaving:
            out.avoid[model] = out.avoid.get(model, frozenset()) | leaving
        for p, _ in olds:
            if p.moving_for:
                clearing.update(dict.fromkeys(p.nodes, p.moving_for))
    if not clearing:
        return
    for d in demands:
        closed = frozenset(n for n, beneficiary in clearing.items() if beneficiary != d.model)
        if closed:
            out.avoid[d.model] = out.avoid.get(d.model, frozenset()) | closed


def _failure(
    p: Placement, status: ReplicaStatus, spec: ModelLifecycle | None, now: datetime
) -> tuple[str, str] | None:
    """(failure reason, removal reason) if the replica failed or its start timed out."""
    where = ", ".join(p.nodes)
    if status.state == FAILED:
        said = status.message or "no message"
        return said, f"replica failed on {where} ({said}); placed again elsewhere"
    if status.state in (PLACED, STARTING):
        timeout = DEFAULT_STARTUP_TIMEOUT
        if spec is not None:
            timeout = spec.startup_timeouts.get(p.profile, timeout)
        if now - status.placed_at > timeout:
            return "startup timeout", (
                f"startup timeout: not ready {format_age(timeout)} after it was placed on "
                f"{where} (state {status.state}); placed again elsewhere"
            )
    return None


def _old_because(p: Placement, spec: ModelLifecycle | None, draining: frozenset[str]) -> str | None:
    if p.moving:
        # Being moved (scheduler.planner.defrag): its copy runs elsewhere already.
        return p.moving
    if draining and (drained := sorted(n for n in p.nodes if n in draining)):
        return f"node {drained[0]} is draining"
    if spec is not None and p.fingerprint and p.fingerprint != spec.fingerprints.get(p.profile):
        if p.profile not in spec.fingerprints:
            return f"profile {p.profile} was removed from the model"
        return f"the definition of profile {p.profile} changed what it runs"
    return None


def _alive(p: Placement, inventory: Mapping[str, Node], state: Mapping[str, Freshness]) -> bool:
    # An old replica on a lost node is not running anything worth holding on to:
    # the usual rules for lost nodes remove it.
    return all(n in inventory and state.get(n) is not Freshness.LOST for n in p.nodes)


def _avoid(out: Judged, lifecycle: Lifecycle, now: datetime) -> None:
    """Nodes each model backs off from: recent failures, and this round's."""
    # model -> node -> (failures in a row, avoided until, last reason)
    avoided: dict[str, dict[str, tuple[int, datetime, str]]] = {}
    for model, records in lifecycle.avoided(now).items():
        avoided[model] = {
            node: (r.failures, lifecycle.backoff.until(r), r.last_reason)
            for node, r in records.items()
        }
    counts = {(f.model, f.node): f.failures for f in lifecycle.failures}
    for failure in out.failures:
        model = failure.placement.model
        for node in failure.placement.nodes:
            failures = counts.get((model, node), 0) + 1
            until = now + lifecycle.backoff.wait(failures)
            avoided.setdefault(model, {})[node] = (failures, until, failure.reason)
    for model, nodes in sorted(avoided.items()):
        out.avoid[model] = frozenset(nodes)
        for node, (failures, until, why) in sorted(nodes.items()):
            out.notes.append(
                (
                    model,
                    f"avoiding node {node} until {until.isoformat(timespec='seconds')} "
                    f"({failures} failure{'s' if failures != 1 else ''} there, last: {why})",
                )
            )


def _roll(
    demand: Demand, old: list[tuple[Placement, str]], out: Judged, lifecycle: Lifecycle
) -> Demand:
    """Remove the old replicas the model can spare; the new count the planner should reach."""
    spec = demand.lifecycle or ModelLifecycle()
    wanted = max(demand.replicas, 0)
    new = [p for p in out.current if p.model == demand.model]
    ready = sum(_ready(lifecycle, p) for p in new) + sum(_ready(lifecycle, p) for p, _ in old)
    floor = max(wanted - spec.max_unavailable, 0)
    held: list[Placement] = []
    # Not-ready old replicas first (they serve nobody), then the highest slots.
    for p, cause in sorted(old, key=lambda pc: (_ready(lifecycle, pc[0]), -pc[0].replica)):
        if not _ready(lifecycle, p):
            out.removals.append(Removal(p, f"{cause}: replaced (it was not ready)"))
            out.reserved.setdefault(demand.model, set()).add(p.replica)
        elif ready - 1 >= (wanted if p.moving else floor):
            # A moved replica stops only once its model is whole without it: a move is
            # surge-first whatever the model's rollout.max_unavailable allows.
            ready -= 1
            out.reserved.setdefault(demand.model, set()).add(p.replica)
            out.removals.append(
                Removal(
                    p, f"{cause}: replaced, {ready} of {wanted} wanted replicas ready without it"
                )
            )
        else:
            held.append(p)
    out.held.extend(held)
    out.rolling[demand.model] = _Rolling(
        wanted, sorted({c for _, c in old}), held, spec.max_unavailable
    )
    target = min(wanted, wanted + spec.max_surge - len(held))
    return replace(demand, replicas=max(target, min(len(new), wanted), 0))


def finish(plan: Plan, judged: Judged, lifecycle: Lifecycle) -> Plan:
    """Fold the lifecycle's decisions into the plan the planner made."""
    if not judged.rolling:
        # No rollout: nothing to count or wait for (at 170,000 placements and 30,000
        # unplaced replicas, the counts below cost some 0.1 s of every round that plans).
        return _finished(plan, judged, plan.unplaced, [])
    unplaced: list[Unplaced] = []
    waits: dict[str, str] = {}
    running: dict[str, int] = {}
    for p in plan.keep + plan.place:
        running[p.model] = running.get(p.model, 0) + 1
    for u in plan.unplaced:
        rolling = judged.rolling.get(u.model)
        held = len(rolling.held) if rolling else 0
        if rolling is not None and running.get(u.model, 0) + held >= rolling.wanted:
            waits.setdefault(u.model, f"room for a surge replica: {u.reason}")
        else:
            unplaced.append(u)
    progress = []
    placed = {(p.model, p.replica) for p in plan.place}
    for model, rolling in sorted(judged.rolling.items()):
        new = tuple(p for p in plan.keep + plan.place if p.model == model and p not in rolling.held)
        waiting = ""
        if model in waits:
            waiting = f"waiting for {waits[model]}"
            if rolling.max_unavailable == 0:
                waiting += "; max_unavailable is 0, so no old replica is stopped first"
        elif rolling.held:
            starting = sorted(
                p.replica for p in new if (p.model, p.replica) in placed or not _ready(lifecycle, p)
            )
            waiting = (
                f"waiting for replica(s) {', '.join(map(str, starting))} to report ready"
                if starting
                else "waiting for the next round to stop an old replica"
            )
        progress.append(
            RolloutProgress(
                model=model,
                cause="; ".join(rolling.causes),
                old=tuple(sorted(rolling.held, key=lambda p: p.replica)),
                new=tuple(sorted(new, key=lambda p: p.replica)),
                waiting=waiting,
            )
        )
    return _finished(plan, judged, tuple(unplaced), progress)


def _finished(
    plan: Plan, judged: Judged, unplaced: tuple[Unplaced, ...], progress: list[RolloutProgress]
) -> Plan:
    return replace(
        plan,
        # ``plan.keep`` is in slot order already; only held replicas need merging in.
        keep=tuple(sorted(plan.keep + tuple(judged.held), key=lambda p: (p.model, p.replica)))
        if judged.held
        else plan.keep,
        unplaced=unplaced,
        failures=tuple(judged.failures),
        rollouts=tuple(progress),
        notes=tuple(judged.notes),
    )


__all__ = ["READY", "Judged", "fingerprint", "finish", "judge", "model_lifecycle"]
