"""The scheduler's storage, as one object: node reports in, placements and their audit out.

The work is done by one module per job; this is the interface the CLI, the
API and the daemon use, and the one the contract suite
(``tests/integration/test_scheduler_store_contract.py``) runs on each back end:

- ``scheduler.persistence.inventory_store``: node reports, forgetting nodes, the inventory;
- ``scheduler.persistence.node_changes``: the inventory a round reads, by what changed;
- ``scheduler.persistence.round_store``: placements, fenced rounds, cordons;
- ``scheduler.persistence.placement_changes``: the placements a round reads, by what changed;
- ``scheduler.persistence.audit_trail``: the placements' audit trail (placement events);
- ``scheduler.persistence.recorded_rounds``: recording a round's inputs and rebuilding them;
- ``scheduler.persistence.lifecycle_store``: replica states, cordons, failures;
- ``scheduler.persistence.outcome_store``: what the last round left unplaced, and why;
- ``scheduler.persistence.serving_policy``: the policy the server runs with, for the CLI's views;
- ``scheduler.persistence.record_format``: the versioned JSON of recorded rounds (pure);
- ``scheduler.persistence.row_decoding``: every row read is decoded there, or skipped and named;
- ``scheduler.persistence.backend``: what differs between SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime

from sqlalchemy import Engine

from events.database.connection import WRITE
from scheduler.lifecycle.endpoints import NO_NETWORKS, EndpointPolicy
from scheduler.lifecycle.inputs import Cordon
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.audit_trail import (
    PLACED,
    REMOVED,
    UPDATED,
    events_head,
    follow_page,
    read_events,
)
from scheduler.persistence.inventory_store import InventoryStore, renew_leases, write_reports
from scheduler.persistence.lease_store import Fence
from scheduler.persistence.lifecycle_store import read_cordons
from scheduler.persistence.node_changes import NodeFeed
from scheduler.persistence.outcome_store import Outcome, UnplacedReason, read_outcome, write_outcome
from scheduler.persistence.placement_changes import PlacementFeed
from scheduler.persistence.record_format import PlacementEvent, RecordedRound
from scheduler.persistence.recorded_rounds import RoundUnreadable, read_recorded_round
from scheduler.persistence.round_store import (
    HostedCounts,
    PlacementState,
    RoundConflict,
    RoundStore,
)
from scheduler.persistence.row_decoding import Unreadable
from scheduler.persistence.serving_policy import (
    PolicyInForce,
    ServingProcess,
    claim_policy,
    read_policy_in_force,
    record_policy,
)
from scheduler.persistence.versions import VersionBook
from scheduler.planner.fleet.inventory import Node, NodeReport
from scheduler.planner.fleet.placements import Placement, Plan


class SchedulerStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.inventory = InventoryStore(engine)
        self.rounds = RoundStore(engine)
        self._hosted = HostedCounts()
        # The definitions of pinned model versions (scheduler.persistence.versions), cached.
        self.versions = VersionBook(engine)

    # -- inventory --------------------------------------------------------

    def report(
        self,
        reports: Sequence[NodeReport],
        received_at: datetime,
        actor: str | Sequence[str] = "agent",
        endpoints: EndpointPolicy = NO_NETWORKS,
    ) -> list[Node]:
        return self.inventory.report(reports, received_at, actor, endpoints)

    def report_and_service(
        self,
        reports: Sequence[NodeReport],
        received_at: datetime,
        actor: str | Sequence[str] = "agent",
        endpoints: EndpointPolicy = NO_NETWORKS,
    ) -> tuple[list[Node], dict[str, Cordon], dict[str, int]]:
        """``report``, then ``service`` of the reported nodes read in the same transaction:
        what the API answers a batch of reports with, for one transaction (and its round
        trips) rather than two.

        Its cost follows the batch, not the cluster: the cordons are read for the
        batch's nodes only, and the replica counts are kept between batches until a
        round is written (``HostedCounts``).
        """
        names = [r.name for r in reports]
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            nodes = write_reports(conn, reports, received_at, actor, endpoints)
            cordons = read_cordons(conn, names)
            every = self._hosted.read(conn)
        # Only nodes that host replicas, as ``service`` counts them.
        hosted = {name: every[name] for name in names if name in every}
        return nodes, cordons, hosted

    def renew_leases(self, leases: Mapping[str, datetime]) -> set[str]:
        """Renew node leases (heartbeats) in one transaction; the names renewed."""
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            return renew_leases(conn, leases)

    def forget(self, name: str) -> bool:
        return self.inventory.forget(name)

    def nodes(self) -> list[Node]:
        return self.inventory.nodes()

    def node_feed(self) -> NodeFeed:
        """The inventory read whole once, then by what changed (``node_changes``): one a
        placer, which keeps it between rounds."""
        return NodeFeed(self.engine)

    # -- placements and rounds --------------------------------------------

    def placement_feed(self) -> PlacementFeed:
        """The placements read whole once, then by what changed (``placement_changes``):
        one a placer, which keeps it between rounds."""
        return PlacementFeed(self.engine)

    def state(self) -> PlacementState:
        return self.rounds.state()

    def replicas(
        self, *, node: str | None = None, model: str | None = None
    ) -> list[tuple[Placement, ReplicaStatus]]:
        return self.rounds.replicas(node=node, model=model)

    def service(self) -> tuple[dict[str, Cordon], dict[str, int]]:
        return self.rounds.service()

    def cordon(self, node: str, mode: str | None, *, actor: str, reason: str) -> Cordon | None:
        return self.rounds.cordon(node, mode, actor=actor, reason=reason)

    def apply(
        self,
        plan: Plan,
        *,
        based_on: PlacementState,
        catalog_position: int,
        nodes: Sequence[Node],
        now: datetime,
        policy: StalenessPolicy,
        definitions: Mapping[tuple[str, str], str] | None = None,
        fence: Fence | None = None,
    ) -> int | None:
        return self.rounds.apply(
            plan,
            based_on=based_on,
            catalog_position=catalog_position,
            nodes=nodes,
            now=now,
            policy=policy,
            definitions=definitions,
            fence=fence,
        )

    def record_outcome(
        self,
        unplaced: Sequence[UnplacedReason],
        *,
        planned_at: datetime,
        catalog_position: int,
        fence: Fence | None = None,
    ) -> None:
        """Replace what the last round left unplaced (``scheduler.persistence.outcome_store``)."""
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            if fence is not None:
                fence(conn)
            write_outcome(conn, unplaced, planned_at=planned_at, catalog_position=catalog_position)

    def outcome(self) -> Outcome | Unreadable | None:
        """What the last round left unplaced; None before any round wrote it."""
        with self.engine.connect() as conn:
            return read_outcome(conn)

    # -- the serving policy -----------------------------------------------

    def record_policy(
        self, who: ServingProcess, policy: StalenessPolicy, *, why: str, now: datetime
    ) -> None:
        """Record the policy a serving process runs with (``serving_policy``)."""
        record_policy(self.engine, who, policy, why=why, now=now)

    def claim_policy(
        self,
        who: ServingProcess,
        policy: StalenessPolicy,
        now: datetime,
        fence: Fence | None = None,
    ) -> bool:
        """Record a placer's policy if the policy in force is another; whether it did.
        Fenced like the round's other writes (``LeadershipLost``)."""
        return claim_policy(self.engine, who, policy, now, fence)

    def policy_in_force(self) -> PolicyInForce:
        """The policy the server runs with, as recorded, and the rows skipped to find it."""
        with self.engine.connect() as conn:
            return read_policy_in_force(conn)

    # -- audit ------------------------------------------------------------

    def events(
        self,
        *,
        model: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        round_id: int | None = None,
        after: int = 0,
        limit: int | None = None,
    ) -> Iterator[PlacementEvent]:
        with self.engine.connect() as conn:
            found = read_events(
                conn,
                model=model,
                since=since,
                until=until,
                round_id=round_id,
                after=after,
                limit=limit,
            )
        yield from found

    def follow_page(self, *, after: int, limit: int) -> list[PlacementEvent | Unreadable]:
        """The next rows of the placement log past ``after``: events, or unreadable rows
        with the reason, in position order (``trail.follow_page``)."""
        with self.engine.connect() as conn:
            return follow_page(conn, after=after, limit=limit)

    def events_head(self) -> int:
        """The last placement event's position (0 for none)."""
        with self.engine.connect() as conn:
            return events_head(conn)

    def recorded_round(
        self, *, round_id: int | None = None, at: datetime | None = None
    ) -> RecordedRound | None:
        """A recorded round by id, or the last one planned at or before ``at``, or the last;
        a round asked for by id that cannot be read raises ``RoundUnreadable``."""
        with self.engine.connect() as conn:
            return read_recorded_round(conn, round_id=round_id, at=at)


__all__ = [
    "PLACED",
    "REMOVED",
    "UPDATED",
    "PlacementEvent",
    "PlacementState",
    "RecordedRound",
    "RoundConflict",
    "RoundUnreadable",
    "SchedulerStore",
]
