"""One placement round: read the catalog, the inventory and the placements, plan, write.

The planner is pure; this is the I/O around it. A round reads only the catalog
events appended since the previous round (the catalog service keeps its replay
state), the inventory and the current placements, and writes its changes in
one transaction (``SchedulerStore.apply``); then, when they differ from the last it
wrote, the replicas it left unplaced and why (``SchedulerStore.record_outcome``, read
by ``GET /v1/fleet``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from events.catalog_service import CatalogService
from scheduler.demands import demands
from scheduler.inventory import Node
from scheduler.memo import memoised_plan as make_plan
from scheduler.outcome_store import UnplacedReason, reasons_of
from scheduler.placements import Placement, Plan
from scheduler.staleness import DEFAULT_STALENESS, StalenessPolicy
from scheduler.store import SchedulerStore


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


class Placer:
    """Runs rounds against one database. Long-lived: keeps the catalog's replay state."""

    def __init__(
        self,
        catalog: CatalogService,
        store: SchedulerStore,
        policy: StalenessPolicy = DEFAULT_STALENESS,
    ) -> None:
        self.catalog = catalog
        self.store = store
        self.policy = policy
        # What this placer last wrote as the unplaced replicas and their reasons: written
        # again only when a round's differ (None: not yet, so the first round writes).
        self._outcome: tuple[UnplacedReason, ...] | None = None

    def run(self, *, dry_run: bool = False, now: datetime | None = None) -> RoundOutcome:
        started = time.perf_counter()
        now = now or datetime.now(UTC)
        catalog = self.catalog.catalog()
        position = self.catalog.position
        nodes = self.store.nodes()
        state = self.store.state()
        plan = make_plan(
            demands(catalog), nodes, state.placements, now, self.policy, lifecycle=state.lifecycle
        )
        round_id = None
        if not dry_run:
            round_id = self.store.apply(
                plan,
                based_on=state,
                catalog_position=position,
                nodes=nodes,
                now=now,
                policy=self.policy,
            )
            unplaced = reasons_of(plan.unplaced)
            if unplaced != self._outcome:
                self.store.record_outcome(unplaced, planned_at=now, catalog_position=position)
                self._outcome = unplaced
        return RoundOutcome(
            plan=plan,
            catalog_position=position,
            nodes=nodes,
            round_id=round_id,
            duration_ms=(time.perf_counter() - started) * 1000,
            before=state.placements,
        )
