"""One placement round: read the catalog, the inventory and the placements, plan, write.

The planner is pure; this is the I/O around it. A round reads only the catalog
events appended since the previous round (the catalog service keeps its replay
state), the nodes changed since the previous round and those not fresh
(``SchedulerStore.node_feed``: the whole inventory only at a placer's first round),
and the placements written since (``SchedulerStore.placement_feed``: whole at the
first round and every few minutes), and plans from what changed
(``scheduler.planner.rounds.incremental``: the previous plan when nothing the planner
reads changed, a full plan otherwise). It writes its changes in one transaction
(``SchedulerStore.apply``, recording the nodes as the planner was given them); then,
when they differ from the last it wrote, the replicas it left unplaced and why
(``SchedulerStore.record_outcome``, read by ``GET /v1/fleet``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from operator import attrgetter, is_
from typing import TYPE_CHECKING, overload

import structlog
from sqlalchemy.exc import DBAPIError

from events.catalog_service import CatalogService
from scheduler.lifecycle.staleness import DEFAULT_STALENESS, StalenessPolicy
from scheduler.persistence.lease_store import Fence
from scheduler.persistence.outcome_store import UnplacedReason, reasons_of
from scheduler.persistence.round_store import PlacementState
from scheduler.persistence.serving_policy import ServingProcess, policy_fields
from scheduler.persistence.store import SchedulerStore
from scheduler.persistence.versions import definitions_to_record
from scheduler.planner.demands import demands
from scheduler.planner.fleet.inventory import FRESH, Node, reported_at
from scheduler.planner.fleet.placements import Demand, Placement, Plan, Unplaced, not_among
from scheduler.planner.rounds.incremental import Changes, IncrementalRounds

if TYPE_CHECKING:
    from catalog import Catalog

log = structlog.get_logger("llmgw.scheduler")


@dataclass(frozen=True, slots=True)
class RoundOutcome:
    plan: Plan
    catalog_position: int
    nodes: Sequence[Node]
    # The recorded round's id; None for a dry run or a round that changed nothing.
    round_id: int | None
    duration_ms: float
    # The placements the round started from.
    before: tuple[Placement, ...] = ()
    # How many nodes the round planned on (``nodes`` is empty when it wrote nothing and
    # was no dry run: building it costs O(nodes), which such a round does not pay).
    node_count: int = 0
    # Why the unplaced replicas' reasons were not recorded (the database failed after
    # the plan was written); None when they were, or had not changed. The next round
    # records them.
    outcome_unrecorded: str | None = None


class _AtBoundary(Sequence[Node]):
    """The nodes a round planned on as it records them: a fresh node (``FRESH``) at the
    freshness ``boundary`` (``record_format.recorded_time``), each built when first read
    (a daemon's round reads none of them)."""

    def __init__(self, nodes: list[Node], boundary: datetime) -> None:
        self._given = nodes
        self._boundary = boundary
        self._built: list[Node] | None = None

    def _nodes(self) -> list[Node]:
        if self._built is None:
            self._built = [
                reported_at(n, self._boundary) if n.reported_at == FRESH else n for n in self._given
            ]
        return self._built

    def __len__(self) -> int:
        return len(self._given)

    @overload
    def __getitem__(self, index: int) -> Node: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Node]: ...
    def __getitem__(self, index: int | slice) -> Node | Sequence[Node]:
        return self._nodes()[index]

    def __iter__(self) -> Iterator[Node]:
        return iter(self._nodes())

    def __eq__(self, other: object) -> bool:
        return list(self) == (list(other) if isinstance(other, Sequence) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._nodes())


def _pinned_now(plan: Plan, before: Sequence[Placement]) -> list[Placement]:
    """The placements this round places or pins to a version they did not have."""
    # Identity first: a kept placement is, nearly always, the very object read (``before``
    # holds one placement a slot, the store's key), and then needs no index of them all.
    others = not_among(plan.keep, before)
    if not others:
        return [*plan.place]
    had = dict(zip(map(_slot, before), before, strict=True))
    return [
        *plan.place,
        *(p for p in others if (was := had.get(_slot(p))) is None or was.version != p.version),
    ]


@contextmanager
def young_objects_kept() -> Iterator[None]:
    """The cycle collector paused for a round, and the round's survivors collected once
    at its end (in the round, so that its cost is the round's).

    A round that plans at 100,000 nodes allocates millions of objects that live for the
    round (indexes, explanations, the write's rows) and are freed by their reference
    counts when it ends. Collected as it goes, every one that lives past two young
    collections is moved to the old generation, and once those reach a quarter of it
    (CPython's rule) a full collection walks every object the process holds: 0.3-1.3 s
    each at that size, one or two a round that plans. Paused, a round's temporaries are
    never walked; what it leaves alive is walked once, at the end, as the young
    generation. The pause is process-wide: in a serving process the other threads'
    garbage in reference cycles waits for the round's end too (their objects without
    cycles are freed as ever). The collector resumes if it was running, however the
    round ends."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)


class Placer:
    """Runs rounds against one database. Long-lived: keeps the catalog's replay state."""

    def __init__(
        self,
        catalog: CatalogService,
        store: SchedulerStore,
        policy: StalenessPolicy = DEFAULT_STALENESS,
        wanted: Callable[[], Mapping[str, int]] | None = None,
        *,
        serving: ServingProcess | None = None,
    ) -> None:
        """``wanted``: the replica counts the autoscaler asks for, read every round.
        ``serving``: the serving process this placer runs in (``serve --with-scheduler``,
        ``daemon``): each round first records its policy if the policy in force is
        another (``scheduler.persistence.serving_policy``), so that the CLI's views judge
        by what places even when its rounds change nothing and are not recorded."""
        self.catalog = catalog
        self.store = store
        self.policy = policy
        self.wanted = wanted
        self.serving = serving
        # What this placer last wrote as the unplaced replicas and their reasons: written
        # again only when a round's differ (None: not yet, so the first round writes).
        self._outcome: tuple[UnplacedReason, ...] | None = None
        # The inventory by what changed, and the round before's inputs and plan.
        self._feed = store.node_feed()
        self._placements = store.placement_feed()
        self._rounds = IncrementalRounds()
        # The catalog and autoscaler counts the last demands were made from, and them:
        # the same catalog object is the same catalog (it is immutable; the catalog
        # service answers a new one when an event is applied).
        self._asked: tuple[Catalog, dict[str, int] | None, tuple[Demand, ...]] | None = None
        # The plan and placements last judged, whether ``SchedulerStore.apply`` writes the
        # plan, and its unplaced replicas' reasons: a round planned from nothing changed
        # answers the round before's plan and placements (the same objects), and judging
        # them again compares every placement.
        self._judged: (
            tuple[Plan, tuple[Placement, ...], bool, tuple[UnplacedReason, ...]] | None
        ) = None

    def run(
        self, *, dry_run: bool = False, now: datetime | None = None, fence: Fence | None = None
    ) -> RoundOutcome:
        """Plan and (unless ``dry_run``) write; every write checks ``fence``, the leader's
        leadership lease, in its transaction (``LeadershipLost`` when it no longer holds).
        The cycle collector waits for the round's end (``young_objects_kept``)."""
        with young_objects_kept():
            return self._run(dry_run=dry_run, now=now, fence=fence)

    def _run(self, *, dry_run: bool, now: datetime | None, fence: Fence | None) -> RoundOutcome:
        started = time.perf_counter()
        now = now or datetime.now(UTC)
        if (
            not dry_run
            and self.serving is not None
            and self.store.claim_policy(self.serving, self.policy, now, fence)
        ):
            log.info("placement.policy_recorded", **policy_fields(self.policy))
        catalog = self.catalog.catalog()
        position = self.catalog.position
        try:
            state, plan = self._plan(catalog, now)
        except BaseException:
            # What the feeds read since may be lost with this round: read it all next time.
            self._feed.forget_all()
            self._placements.forget_all()
            raise
        state = self._as_planned(state)
        writes, unplaced = self._judge(plan, state.placements)
        writes = writes and not dry_run
        # The nodes as the planner was given them: what a round records (each fresh node at
        # the freshness boundary, ``record_format.recorded_time``), what a dry run shows.
        # Kept from round to round (``IncrementalRounds.planned_nodes``): a round that
        # writes no longer builds every node again at the boundary to record them.
        planned = self._rounds.planned_nodes() if dry_run or writes else []
        nodes = _AtBoundary(planned, now - self.policy.stale_after)
        round_id = None
        outcome_unrecorded: str | None = None
        if not dry_run:
            # ``apply`` writes nothing for a plan that changes nothing (and finds so by
            # comparing every placement again): not called for one.
            if writes:
                round_id = self.store.apply(
                    plan,
                    based_on=state,
                    catalog_position=position,
                    nodes=planned,
                    now=now,
                    policy=self.policy,
                    # Every placement pinned to the current version, placed now or pinned
                    # now: its definition is recorded with the round
                    # (scheduler.persistence.versions).
                    definitions=definitions_to_record(catalog, _pinned_now(plan, state.placements)),
                    fence=fence,
                )
            if unplaced != self._outcome:
                try:
                    self.store.record_outcome(
                        unplaced, planned_at=now, catalog_position=position, fence=fence
                    )
                except DBAPIError as exc:
                    if round_id is None:
                        raise  # nothing written: the round failed as a whole
                    # The plan is written (its own transaction): the round stands and is
                    # reported as placed. Raising here reported it failed, and the
                    # replicas it placed were never logged as placed (a database lost
                    # between the two writes).
                    outcome_unrecorded = str(exc.orig or exc).strip().splitlines()[0]
                else:
                    self._outcome = unplaced
        return RoundOutcome(
            plan=plan,
            catalog_position=position,
            nodes=nodes,
            round_id=round_id,
            duration_ms=(time.perf_counter() - started) * 1000,
            before=state.placements,
            node_count=self._rounds.node_count,
            outcome_unrecorded=outcome_unrecorded,
        )

    def _plan(self, catalog: Catalog, now: datetime) -> tuple[PlacementState, Plan]:
        """Read what changed, then plan from it (``scheduler.planner.rounds.incremental``)."""
        read = self._feed.read(now, self.policy.stale_after)
        placed = self._placements.read(now)
        state = placed.state
        asked = self._demands(catalog, self.wanted() if self.wanted else None)
        if read.whole or not self._rounds.started:
            if not read.whole:
                self._feed.forget_all()
                read = self._feed.read(now, self.policy.stale_after)
            plan = self._rounds.start(
                asked, read.nodes, state.placements, now, self.policy, lifecycle=state.lifecycle
            )
        else:
            plan = self._rounds.next(
                Changes(
                    now=now,
                    not_fresh=read.not_fresh,
                    nodes=read.nodes,
                    forgotten=read.forgotten,
                    demands=asked,
                    # The same objects as the round before's when nothing in them changed.
                    current=state.placements if placed.changed else None,
                    lifecycle=state.lifecycle if placed.changed else None,
                    policy=self.policy,
                )
            )
        return state, plan

    def _as_planned(self, state: PlacementState) -> PlacementState:
        """``state`` with the placements as the planner held them: after a write they are
        read back as new objects, which the planner takes for its own plan's (the same
        fields; ``IncrementalRounds.held_for``), and its plan keeps those. Compared with
        the objects read, every kept placement was another object, and ``apply`` and
        ``_pinned_now`` indexed every placement by slot to compare them by content (at
        170,000 placements 0.3-0.6 s of a lost node's round); compared with these, the
        kept ones are found by identity. The same values, so the same writes."""
        held = self._rounds.held_for(state.placements)
        if held is None or held is state.placements:
            return state
        return replace(state, placements=held)

    def _demands(self, catalog: Catalog, wanted: Mapping[str, int] | None) -> tuple[Demand, ...]:
        """``demands(catalog, wanted)``, made again only when either changed."""
        held = self._asked
        if held is not None and held[0] is catalog and held[1] == wanted:
            return held[2]
        asked = tuple(demands(catalog, wanted))
        self._asked = (catalog, None if wanted is None else dict(wanted), asked)
        return asked

    def _judge(
        self, plan: Plan, before: tuple[Placement, ...]
    ) -> tuple[bool, tuple[UnplacedReason, ...]]:
        """Whether ``SchedulerStore.apply`` records ``plan`` (based on ``before``), and the
        reasons of its unplaced replicas; judged again only for another plan or placements."""
        judged = self._judged
        if judged is not None and judged[0] is plan and judged[1] is before:
            return judged[2], judged[3]
        writes, unplaced = _writes(plan, before), self._reasons_of(plan.unplaced)
        self._judged = (plan, before, writes, unplaced)
        return writes, unplaced

    def _reasons_of(self, unplaced: tuple[Unplaced, ...]) -> tuple[UnplacedReason, ...]:
        """``reasons_of(unplaced)``, each reason of an ``Unplaced`` the last judged plan
        held (the very object: a model explained as the round before keeps its objects,
        ``plan.ExplainMemo``) taken again: equal, and then the same objects as the outcome
        last written, which is compared by identity first."""
        judged = self._judged
        if judged is None:
            return reasons_of(unplaced)
        before, reasons = judged[0].unplaced, judged[3]
        at = {id(u): i for i, u in enumerate(before)}
        return tuple(
            reasons[i]
            if (i := at.get(id(u))) is not None and before[i] is u
            else UnplacedReason(u.model, u.replica, u.reason)
            for u in unplaced
        )


def _writes(plan: Plan, before: Sequence[Placement]) -> bool:
    """Whether ``SchedulerStore.apply`` records the plan: it places, removes or updates."""
    if plan.place or plan.remove:
        return True
    # Nearly always every placement kept as the very object read, in the same order: no
    # index of every placement needed to see it (at 100,000 nodes the index cost more
    # than the rest of a round that writes nothing).
    if len(plan.keep) == len(before) and all(map(is_, plan.keep, before)):
        return False
    had = {(p.model, p.replica): p for p in before}
    return any((was := had.get((p.model, p.replica))) is not p and was != p for p in plan.keep)


# A placement's slot, read in C: (model, replica), the store's key.
_slot = attrgetter("model", "replica")
