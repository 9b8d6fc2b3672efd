"""The scheduler's storage: node reports in, placements and their audit trail out.

Applying a plan is one transaction, fenced like the catalog's log: a round is
planned from the placements as of round N and is written only if no other
round was written since. Two daemons that both believe they lead (a network
partition, a paused process) therefore cannot both apply plans made from the
same state; the loser's round is refused and it plans again from what is
there. Rounds are numbered gaplessly under the write lock, and so are
placement events, for the same reason as the catalog's positions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from events.db import WRITE
from scheduler.inventory import Node, NodeReport
from scheduler.lifecycle import Cordon, Lifecycle
from scheduler.lifecycle_store import (
    REPLICA_FAILED,
    TrailEntry,
    append_trail,
    lock_trail,
    read_cordons,
    read_failures,
    read_statuses,
    record_failures,
    record_replica_reports,
    set_cordon,
)
from scheduler.placements import Placement, Plan
from scheduler.replicas import PLACED as PLACED_STATE
from scheduler.replicas import ReplicaStatus
from scheduler.staleness import StalenessPolicy
from scheduler.tables import (
    InventoryRow,
    NodeRow,
    PlacementEventRow,
    PlacementRoundRow,
    PlacementRow,
    table,
)

nodes_t = table(NodeRow)
placements_t = table(PlacementRow)
rounds_t = table(PlacementRoundRow)
inventories_t = table(InventoryRow)
pevents_t = table(PlacementEventRow)

PLACED = "placement.placed"
REMOVED = "placement.removed"
UPDATED = "placement.updated"


class RoundConflict(Exception):
    """Another round was written since this one read the placements; nothing was written."""


@dataclass(frozen=True, slots=True)
class PlacementState:
    """The placements as of a round: what a plan starts from."""

    round_id: int
    placements: tuple[Placement, ...]
    # Replica states, cordons and failures, read with the placements.
    lifecycle: Lifecycle = field(default_factory=Lifecycle)


@dataclass(frozen=True, slots=True)
class PlacementEvent:
    position: int
    round_id: int
    type: str
    model: str
    replica: int
    profile: str
    nodes: tuple[str, ...]
    reason: str
    catalog_position: int
    recorded_at: datetime
    actor: str = ""


@dataclass(frozen=True, slots=True)
class RecordedRound:
    """A round as recorded: the exact inputs its plan was made from."""

    id: int
    planned_at: datetime
    catalog_position: int
    nodes: tuple[Node, ...]
    current: tuple[Placement, ...]
    policy: StalenessPolicy
    placed: int
    removed: int
    unplaced: int
    lifecycle: Lifecycle = field(default_factory=Lifecycle)


def node_content(node: Node) -> dict[str, Any]:
    """A node's reported content, without the time it was reported."""
    return {
        "name": node.name,
        "gpu_class": node.gpu_class,
        "gpus": node.gpus,
        "gpus_reserved": node.gpus_reserved,
        "memory_gb": node.memory_gb,
        "labels": dict(sorted(node.labels.items())),
        "fabric": node.fabric,
    }


def node_from_content(content: Mapping[str, Any], reported_at: datetime) -> Node:
    """The inverse of ``node_content``, given when the node reported."""
    return Node(
        name=content["name"],
        gpu_class=content["gpu_class"],
        gpus=content["gpus"],
        gpus_reserved=content["gpus_reserved"],
        memory_gb=content["memory_gb"],
        labels=content["labels"],
        fabric=content["fabric"],
        reported_at=reported_at,
    )


def inventory_digest(nodes: Iterable[Node]) -> str:
    """A digest of what the nodes reported (not when): equal inventories, equal digests."""
    content = sorted((node_content(n) for n in nodes), key=lambda c: c["name"])
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def placement_json(p: Placement) -> dict[str, Any]:
    data = asdict(p)
    data["nodes"] = list(p.nodes)
    return data


def placement_from_json(data: dict[str, Any]) -> Placement:
    return Placement(**{**data, "nodes": tuple(data["nodes"])})


def _policy_json(policy: StalenessPolicy) -> str:
    return json.dumps(
        {
            "stale_after_s": policy.stale_after.total_seconds(),
            "grace_s": policy.grace.total_seconds(),
            "mass_loss_fraction": policy.mass_loss_fraction,
            "preemption": policy.preemption,
        }
    )


def _policy_from_json(text: str) -> StalenessPolicy:
    data = json.loads(text)
    return StalenessPolicy(
        stale_after=timedelta(seconds=data["stale_after_s"]),
        grace=timedelta(seconds=data["grace_s"]),
        mass_loss_fraction=data["mass_loss_fraction"],
        # Rounds recorded before the switch existed were planned without
        # priorities, where preemption cannot evict anything: on is the same.
        preemption=data.get("preemption", True),
    )


class SchedulerStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- inventory --------------------------------------------------------

    def report(
        self, reports: Sequence[NodeReport], received_at: datetime, actor: str = "agent"
    ) -> list[Node]:
        """Record reports (each also a heartbeat) in one transaction, stamped on our clock.

        A report's replica states, if it has any, are recorded in the same
        transaction (``scheduler.lifecycle_store``), each change an event by ``actor``.
        """
        nodes = [r.to_node(received_at) for r in reports]
        if not nodes:
            return nodes
        rows = [
            {
                **node_content(n),
                "labels": json.dumps(node_content(n)["labels"]),
                "reported_at": n.reported_at,
            }
            for n in nodes
        ]
        dialect = self.engine.dialect.name
        upsert_insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        stmt = upsert_insert(nodes_t)
        stmt = stmt.on_conflict_do_update(
            index_elements=[nodes_t.c.name],
            set_={c: stmt.excluded[c] for c in rows[0] if c != "name"},
        )
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            conn.execute(stmt, rows)
            record_replica_reports(conn, reports, received_at, actor)
        return nodes

    def forget(self, name: str) -> bool:
        """Drop a node from the inventory (decommissioned); its replicas move next round."""
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            return conn.execute(delete(nodes_t).where(nodes_t.c.name == name)).rowcount > 0

    def nodes(self) -> list[Node]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(nodes_t).order_by(nodes_t.c.name)).mappings().all()
        return [
            node_from_content({**r, "labels": json.loads(r["labels"])}, r["reported_at"])
            for r in rows
        ]

    # -- placements -------------------------------------------------------

    def state(self) -> PlacementState:
        """The current placements and the round they are as of.

        The round is read first: if a round commits between the two reads, the
        placements are newer than the round number, and applying a plan then
        fails safe (a conflict) rather than passing on stale placements.
        """
        with self.engine.connect() as conn:
            round_id = _round_head(conn)
            rows = (
                conn.execute(
                    select(placements_t).order_by(placements_t.c.model, placements_t.c.replica)
                )
                .mappings()
                .all()
            )
            lifecycle = Lifecycle(
                statuses=read_statuses(conn),
                cordons=read_cordons(conn),
                failures=read_failures(conn),
            )
        placements = tuple(
            Placement(
                model=r["model"],
                replica=r["replica"],
                profile=r["profile"],
                nodes=tuple(json.loads(r["nodes"])),
                gpus_per_node=r["gpus_per_node"],
                gpu_class=r["gpu_class"],
                memory_gb_per_node=r["memory_gb_per_node"],
                fingerprint=r["fingerprint"],
            )
            for r in rows
        )
        return PlacementState(round_id, placements, lifecycle)

    def replicas(
        self, *, node: str | None = None, model: str | None = None
    ) -> list[tuple[Placement, ReplicaStatus]]:
        """Every placement with its state, optionally only those on ``node`` or of ``model``."""
        state = self.state()
        return [
            (p, state.lifecycle.statuses.get((p.model, p.replica)) or _unknown_status())
            for p in state.placements
            if (node is None or node in p.nodes) and (model is None or p.model == model)
        ]

    def service(self) -> tuple[dict[str, Cordon], dict[str, int]]:
        """The cordons by node, and how many replicas each node hosts: what `nodes list` shows."""
        hosted: dict[str, int] = {}
        with self.engine.connect() as conn:
            cordons = read_cordons(conn)
            for (nodes_text,) in conn.execute(select(placements_t.c.nodes)):
                for name in json.loads(nodes_text):
                    hosted[name] = hosted.get(name, 0) + 1
        return cordons, hosted

    def cordon(self, node: str, mode: str | None, *, actor: str, reason: str) -> Cordon | None:
        """Cordon, drain or (``mode`` None) uncordon a node; returns how it was before."""
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            return set_cordon(conn, node, mode, actor=actor, reason=reason, now=_utcnow())

    def apply(
        self,
        plan: Plan,
        *,
        based_on: PlacementState,
        catalog_position: int,
        nodes: Sequence[Node],
        now: datetime,
        policy: StalenessPolicy,
    ) -> int | None:
        """Write a plan's changes and its audit trail in one transaction.

        Returns the new round's id, or None when the plan changes nothing (such
        a round is not recorded). Raises ``RoundConflict`` if another round was
        written since ``based_on`` was read.
        """
        before = {(p.model, p.replica): p for p in based_on.placements}
        updated = [p for p in plan.keep if before.get((p.model, p.replica)) != p]
        if not (plan.place or plan.remove or updated):
            return None
        digest = inventory_digest(nodes)
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            lock_trail(conn)
            head = _round_head(conn)
            if head != based_on.round_id:
                raise RoundConflict(
                    f"round {head} was written since this plan read round {based_on.round_id}"
                )
            round_id = head + 1
            if (
                conn.execute(
                    select(inventories_t.c.digest).where(inventories_t.c.digest == digest)
                ).first()
                is None
            ):
                content = sorted((node_content(n) for n in nodes), key=lambda c: c["name"])
                conn.execute(
                    insert(inventories_t), {"digest": digest, "nodes": json.dumps(content)}
                )
            conn.execute(
                insert(rounds_t),
                {
                    "id": round_id,
                    "planned_at": now,
                    "catalog_position": catalog_position,
                    "inventory_digest": digest,
                    "reported_at": json.dumps(
                        {n.name: n.reported_at.isoformat() for n in nodes}, sort_keys=True
                    ),
                    "current": json.dumps([placement_json(p) for p in based_on.placements]),
                    "policy": _policy_json(policy),
                    "placed": len(plan.place),
                    "removed": len(plan.remove),
                    "unplaced": len(plan.unplaced),
                    "lifecycle": json.dumps(based_on.lifecycle.to_json()),
                },
            )
            for removal in plan.remove:
                p = removal.placement
                conn.execute(
                    delete(placements_t).where(
                        placements_t.c.model == p.model, placements_t.c.replica == p.replica
                    )
                )
            if plan.place:
                conn.execute(
                    insert(placements_t),
                    [_placement_row(p, round_id, now) for p in plan.place],
                )
            for p in updated:
                conn.execute(
                    update(placements_t)
                    .where(placements_t.c.model == p.model, placements_t.c.replica == p.replica)
                    .values(memory_gb_per_node=p.memory_gb_per_node, fingerprint=p.fingerprint)
                )
            record_failures(
                conn,
                {
                    (f.placement.model, n): f.reason
                    for f in plan.failures
                    for n in f.placement.nodes
                },
                now,
            )
            trail = [
                *((REPLICA_FAILED, f.placement, f.reason) for f in plan.failures),
                *((REMOVED, r.placement, r.reason) for r in plan.remove),
                *((PLACED, p, "") for p in plan.place),
                *((UPDATED, p, _update_reason(before[(p.model, p.replica)], p)) for p in updated),
            ]
            append_trail(
                conn,
                (
                    TrailEntry(kind, p.model, p.replica, p.profile, p.nodes, reason)
                    for kind, p, reason in trail
                ),
                now=now,
                round_id=round_id,
                catalog_position=catalog_position,
            )
        return round_id

    # -- audit ------------------------------------------------------------

    def events(
        self,
        *,
        model: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        round_id: int | None = None,
    ) -> Iterator[PlacementEvent]:
        query = select(pevents_t).order_by(pevents_t.c.position)
        if round_id is not None:
            query = query.where(pevents_t.c.round_id == round_id)
        if model is not None:
            query = query.where(pevents_t.c.model == model)
        if since is not None:
            query = query.where(pevents_t.c.recorded_at >= since)
        if until is not None:
            query = query.where(pevents_t.c.recorded_at <= until)
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        for r in rows:
            yield PlacementEvent(
                position=r["position"],
                round_id=r["round_id"],
                type=r["type"],
                model=r["model"],
                replica=r["replica"],
                profile=r["profile"],
                nodes=tuple(json.loads(r["nodes"])),
                reason=r["reason"],
                catalog_position=r["catalog_position"],
                recorded_at=r["recorded_at"],
                actor=r["actor"],
            )

    def recorded_round(
        self, *, round_id: int | None = None, at: datetime | None = None
    ) -> RecordedRound | None:
        """A recorded round by id, or the last one planned at or before ``at``, or the last."""
        query = select(rounds_t)
        if round_id is not None:
            query = query.where(rounds_t.c.id == round_id)
        elif at is not None:
            query = query.where(rounds_t.c.planned_at <= at)
        query = query.order_by(rounds_t.c.id.desc()).limit(1)
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
            if row is None:
                return None
            content = conn.execute(
                select(inventories_t.c.nodes).where(
                    inventories_t.c.digest == row["inventory_digest"]
                )
            ).scalar_one()
        reported = json.loads(row["reported_at"])
        nodes = tuple(
            node_from_content(c, datetime.fromisoformat(reported[c["name"]]))
            for c in json.loads(content)
        )
        return RecordedRound(
            id=row["id"],
            planned_at=row["planned_at"],
            catalog_position=row["catalog_position"],
            nodes=nodes,
            current=tuple(placement_from_json(p) for p in json.loads(row["current"])),
            policy=_policy_from_json(row["policy"]),
            placed=row["placed"],
            removed=row["removed"],
            unplaced=row["unplaced"],
            lifecycle=Lifecycle.from_json(
                None if row["lifecycle"] is None else json.loads(row["lifecycle"])
            ),
        )


def _placement_row(p: Placement, round_id: int, now: datetime) -> dict[str, Any]:
    return {
        "model": p.model,
        "replica": p.replica,
        "profile": p.profile,
        "nodes": json.dumps(list(p.nodes)),
        "gpus_per_node": p.gpus_per_node,
        "gpu_class": p.gpu_class,
        "memory_gb_per_node": p.memory_gb_per_node,
        "round_id": round_id,
        "placed_at": now,
        "fingerprint": p.fingerprint,
        "state": "placed",
        "state_since": now,
    }


def _update_reason(before: Placement, after: Placement) -> str:
    if before.fingerprint != after.fingerprint:
        return "recorded what the replica runs (its fingerprint), for later rollouts"
    return "the profile's memory need changed"


def _unknown_status() -> ReplicaStatus:
    # Only for a placement deleted between the two reads of ``state``.
    epoch = datetime.fromtimestamp(0, UTC)
    return ReplicaStatus(PLACED_STATE, epoch, epoch, reported=False)


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _round_head(conn: Connection) -> int:
    return int(conn.execute(select(func.coalesce(func.max(rounds_t.c.id), 0))).scalar_one())
