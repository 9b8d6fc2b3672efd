"""What the planner is asked for and what it answers: demands, placements, plans."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from operator import is_, not_
from typing import Any, TypeVar

from catalog.definition.views import PlacementProfile
from scheduler.lifecycle.inputs import ModelLifecycle, RunningCopy
from scheduler.planner.fleet.rejections import ProfileRejections


@dataclass(frozen=True, slots=True)
class Demand:
    """How many replicas of a model the cluster should run, and how each may run.

    ``profiles`` keep the catalog's declaration order, which breaks ties between
    profiles of equal priority. ``priority``, ``spread_by`` and
    ``spread_required`` are the model's ``placement:`` rules (see
    ``catalog.definition.model.PlacementRules``).
    """

    model: str
    replicas: int
    profiles: tuple[PlacementProfile, ...]
    # Fingerprints, startup timeouts and rollout bounds; None plans as before lifecycles.
    lifecycle: ModelLifecycle | None = None
    priority: int = 0
    spread_by: str | None = None
    spread_required: bool = False


@dataclass(frozen=True, slots=True)
class Placement:
    """One replica slot of a model, bound to a profile and the nodes that run it.

    ``replica`` is the slot's stable identity (0-based): a replica keeps its
    index for as long as it runs, so a plan can say which one it removes.
    ``memory_gb_per_node`` is what the replica consumes on each of its nodes.
    """

    model: str
    replica: int
    profile: str
    nodes: tuple[str, ...]
    gpus_per_node: int
    gpu_class: str | None
    memory_gb_per_node: int = 0
    # What the replica runs, as placed (``scheduler.planner.rollout.fingerprint``); a
    # change to it is what a rollout replaces. "" for one placed before fingerprints.
    fingerprint: str = ""
    # The model version (definition digest) the replica was placed with: its agent
    # runs that version's definition until a rollout replaces the replica. "" for
    # one placed before versions (its agent is sent the current definition).
    version: str = ""
    # Non-empty while the replica is being moved (``scheduler.planner.defrag``): why
    # ("to make room for model X, profile P on node N"). A copy runs elsewhere and the
    # rollout machinery stops this one once the model is whole without it.
    moving: str = ""
    # The model the move makes room for ("" for a spread repair): its node is kept
    # free of other new replicas while the move is under way.
    moving_for: str = ""


@dataclass(frozen=True, slots=True)
class Move:
    """One replica to run on ``to`` instead of where it runs, and why.

    Surge-first: the plan places ``copy`` (the new replica, on ``to``) and marks the
    moved placement (``placement``, now carrying ``moving``); a later round stops it
    once its model has all its wanted replicas ready without it."""

    placement: Placement
    to: str
    reason: str
    copy: Placement | None = None


@dataclass(frozen=True, slots=True)
class Removal:
    """A current placement the plan gives up, and why."""

    placement: Placement
    reason: str


@dataclass(frozen=True, slots=True)
class Failure:
    """A replica the round counts as failed: its agent said so, or its startup timed out.

    It is also among the plan's removals; its nodes are avoided for its model
    with a growing back-off (``scheduler.lifecycle.inputs.BackoffPolicy``).
    """

    placement: Placement
    reason: str


@dataclass(frozen=True, slots=True)
class RolloutProgress:
    """Where a model's replacement of its replicas stands after a round.

    ``old`` are replicas running what the model no longer runs (or on a
    draining node), kept until enough new ones are ready; ``new`` the others.
    ``waiting`` says what the rollout waits for ("" once it is done).
    """

    model: str
    cause: str
    old: tuple[Placement, ...]
    new: tuple[Placement, ...]
    waiting: str


@dataclass(frozen=True, slots=True)
class Unplaced:
    """A replica the cluster should run but that fits nowhere.

    ``reason`` is for people; ``rejections`` holds the same counts, per profile
    tried, for an API to return as data.
    """

    model: str
    replica: int
    reason: str
    rejections: tuple[ProfileRejections, ...]


@dataclass(frozen=True, slots=True)
class Resilience:
    """How many failures a model survives (computed by ``scheduler.planner.resilience``).

    ``nodes`` (and ``domains`` of ``label``) whose loss leaves the model no replica; 0 when
    it has none placed. ``domains`` is None for a model without ``spread_by``."""

    model: str
    replicas: int
    nodes: int
    label: str | None = None
    domains: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "replicas": self.replicas,
            "nodes": self.nodes,
            "spread_by": self.label,
            "domains": self.domains,
        }

    def describe(self) -> str:
        """``lost with 2 nodes, 1 zone value (2 replicas)``."""
        if self.replicas == 0:
            return "no replica placed"
        text = f"lost with {_count(self.nodes, 'node')}"
        if self.label is not None and self.domains is not None:
            text += f", {_count(self.domains, f'{self.label} value')}"
        return f"{text} ({_count(self.replicas, 'replica')})"


@dataclass(frozen=True, slots=True)
class Plan:
    """The outcome of one placement round.

    ``keep`` holds current placements as they should be recorded now: one whose
    profile's memory need changed carries the new ``memory_gb_per_node``, which
    is the only field a kept placement can change. ``mass_loss`` says that so
    many nodes looked lost at once that their replicas were kept anyway;
    ``lost_nodes`` are the nodes hosting current placements that looked lost,
    whether or not that led to removals. ``strategy`` says how the new replicas
    were placed: ``policy`` (the planner's own way), or ``best fit`` / ``first
    fit`` when that baseline placed more GPUs (see ``scheduler.planner.packing``).
    Evictions are in ``remove``, with the reason ``preempted by MODEL[replica]``.
    ``resilience`` is each demanded model's under ``placements``.
    """

    keep: tuple[Placement, ...]
    place: tuple[Placement, ...]
    remove: tuple[Removal, ...]
    unplaced: tuple[Unplaced, ...]
    mass_loss: bool = False
    lost_nodes: tuple[str, ...] = ()
    strategy: str = "policy"
    resilience: tuple[Resilience, ...] = ()
    # The replica lifecycle (scheduler.lifecycle.inputs): replicas failed this round,
    # rollouts in progress, and (model, note) lines such as a node backing off.
    failures: tuple[Failure, ...] = ()
    rollouts: tuple[RolloutProgress, ...] = ()
    notes: tuple[tuple[str, str], ...] = ()
    # Moves started this round (defragmentation, spread repair), and those under way.
    moves: tuple[Move, ...] = ()
    moving: tuple[Placement, ...] = ()
    # Replicas placed again where their engines still run (``scheduler.planner.readoption``):
    # the engine each one is, whose state and endpoint the new placement starts with.
    again: tuple[RunningCopy, ...] = ()

    @property
    def placements(self) -> tuple[Placement, ...]:
        """Every placement once the plan is applied, sorted by (model, replica)."""
        return tuple(sorted(self.keep + self.place, key=lambda p: (p.model, p.replica)))

    @property
    def changes_anything(self) -> bool:
        """Whether applying the plan would start or stop anything."""
        return bool(self.place or self.remove)


def _count(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


_T = TypeVar("_T")


def same_objects(old: Sequence[object], new: Sequence[object]) -> bool:
    """Whether two sequences hold the very same objects in the same order (in C)."""
    return len(old) == len(new) and all(map(is_, old, new))


def removed_from(old: Sequence[_T], new: Sequence[_T]) -> list[_T] | None:
    """The objects of ``old`` that ``new`` lacks, if ``new`` is ``old`` without them (the
    same objects, in the same order); None if it is anything else. What a round's memo of
    the round before's placements is patched by (``survivors``, ``spread``, ``defrag``)."""
    if len(new) > len(old):
        return None
    if len(new) == len(old):
        return [] if all(map(is_, old, new)) else None
    there = set(map(id, new))
    if len(there) != len(new):
        return None
    # In C: which of ``old`` are still there, then the two parts by those flags.
    flags = list(map(there.__contains__, map(id, old)))
    removed = list(compress(old, map(not_, flags)))
    if len(removed) + len(new) != len(old):
        return None
    return removed if all(map(is_, compress(old, flags), new)) else None


# The last answer of ``not_among`` with the sequences it was made from: a placer asks it
# twice a round of the same plan and placements (the pinned placements, then the write).
_NOT_AMONG: list[tuple[Sequence[object], Sequence[object], list[Any]]] = []


def not_among(new: Sequence[_T], old: Sequence[_T]) -> list[_T]:
    """The objects of ``new`` that are not objects of ``old`` (by identity), in order: in
    C, without an index of ``old`` by content (a round's kept placements are nearly all
    the very objects read, and at 170,000 an index of them by slot was 0.1 s or more).
    Answered again for the very same objects as the last call's (a pass of each in C
    instead of a set of every id)."""
    for was_new, was_old, answer in list(_NOT_AMONG):
        if same_objects(was_new, new) and same_objects(was_old, old):
            return list(answer)
    were = set(map(id, old))
    found = list(compress(new, map(not_, map(were.__contains__, map(id, new)))))
    _NOT_AMONG[:] = [(tuple(new), tuple(old), list(found))]
    return found


# The last few answers of ``changed_from``, with the sequences they were made from: a
# round's memos of the kept placements (the spread counts, the defragmentation's index and
# its budgets) each diff the round before's with this round's, the same objects in each
# (their lists are copies). Each entry is replaced whole, so threads share it safely.
_DIFFS: list[tuple[Sequence[object], Sequence[object], tuple[list[Any], list[Any]] | None]] = []
_DIFFS_KEPT = 2


def changed_from(old: Sequence[_T], new: Sequence[_T]) -> tuple[list[_T], list[_T]] | None:
    """The objects of ``old`` that ``new`` lacks and those it adds, if ``new`` is ``old``
    without the first and with the second (the objects of both the same, in the same order;
    each object once); None if it is anything else. What a round's memo of the round
    before's placements is patched by when a write placed some (``spread``, ``defrag``).

    Answered again from the last few calls when both sequences hold the very same objects
    in the same order as one of theirs (a pass of each in C, where the diff hashes every
    object twice: at 170,000 placements 30-60 ms a call, three calls a round)."""
    for was, now, answer in list(_DIFFS):
        if same_objects(was, old) and same_objects(now, new):
            return None if answer is None else (list(answer[0]), list(answer[1]))
    found = _changed_from(old, new)
    entry = (tuple(old), tuple(new), None if found is None else (list(found[0]), list(found[1])))
    _DIFFS[:] = [entry, *_DIFFS[: _DIFFS_KEPT - 1]]
    return found


def _changed_from(old: Sequence[_T], new: Sequence[_T]) -> tuple[list[_T], list[_T]] | None:
    there, were = set(map(id, new)), set(map(id, old))
    if len(there) != len(new) or len(were) != len(old):
        return None
    # In C: which of each are in the other, then the parts by those flags.
    kept = list(map(there.__contains__, map(id, old)))
    stayed = list(map(were.__contains__, map(id, new)))
    if not all(map(is_, compress(old, kept), compress(new, stayed))):
        return None
    return list(compress(old, map(not_, kept))), list(compress(new, map(not_, stayed)))
