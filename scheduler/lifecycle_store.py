"""Storage of the replica lifecycle: states reported by agents, cordons, failures.

Each state change, cordon and drain is also a placement event (with who caused
it), numbered in the same gapless sequence as a round's events and under the
same lock, so ``history --placements`` tells one story in one order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy import Connection, delete, func, insert, select, update

from scheduler.inventory import NodeReport
from scheduler.lifecycle import Cordon, FailureRecord
from scheduler.replicas import FAILED, PLACED, READY, ReplicaStatus
from scheduler.tables import (
    CordonRow,
    FailureRow,
    NodeRow,
    PlacementEventRow,
    PlacementRoundRow,
    PlacementRow,
    table,
)

log = structlog.get_logger("llmgw.scheduler")

nodes_t = table(NodeRow)
placements_t = table(PlacementRow)
rounds_t = table(PlacementRoundRow)
pevents_t = table(PlacementEventRow)
cordons_t = table(CordonRow)
failures_t = table(FailureRow)

# Event types of what happens to a replica between rounds, and to nodes.
REPLICA_EVENT = "replica.{state}"  # replica.starting, replica.ready, replica.failed
REPLICA_FAILED = "replica.failed"
NODE_CORDONED = "node.cordoned"
NODE_DRAINING = "node.draining"
NODE_UNCORDONED = "node.uncordoned"


@dataclass(frozen=True, slots=True)
class TrailEntry:
    """One placement event to append."""

    type: str
    model: str
    replica: int
    profile: str
    nodes: Sequence[str]
    reason: str
    actor: str = ""


def lock_trail(conn: Connection) -> None:
    """The lock under which rounds and placement events are numbered (PostgreSQL)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("LOCK TABLE placement_rounds IN EXCLUSIVE MODE")


def append_trail(
    conn: Connection,
    entries: Iterable[TrailEntry],
    *,
    now: datetime,
    round_id: int | None = None,
    catalog_position: int | None = None,
) -> None:
    """Append placement events, numbered after the last; call under ``lock_trail``.

    Events outside a round name the last round and its catalog position: the
    state the change happened in.
    """
    rows = list(entries)
    if not rows:
        return
    if round_id is None or catalog_position is None:
        last = conn.execute(
            select(rounds_t.c.id, rounds_t.c.catalog_position).order_by(rounds_t.c.id.desc())
        ).first()
        round_id, catalog_position = (0, 0) if last is None else (last[0], last[1])
    first = (
        int(conn.execute(select(func.coalesce(func.max(pevents_t.c.position), 0))).scalar_one()) + 1
    )
    conn.execute(
        insert(pevents_t),
        [
            {
                "position": first + i,
                "round_id": round_id,
                "type": e.type,
                "model": e.model,
                "replica": e.replica,
                "profile": e.profile,
                "nodes": json.dumps(list(e.nodes)),
                "reason": e.reason,
                "catalog_position": catalog_position,
                "recorded_at": now,
                "actor": e.actor,
            }
            for i, e in enumerate(rows)
        ],
    )


def record_replica_reports(
    conn: Connection, reports: Sequence[NodeReport], now: datetime, actor: str
) -> None:
    """Apply the replica states in ``reports``; one event per state that changed.

    A report about a replica that is not placed on the reporting node (it was
    moved, or removed, or never existed) is ignored and logged: a late report
    from the old node must not mark the replica's new placement ready.
    """
    with_replicas = [r for r in reports if r.replicas is not None]
    if not with_replicas:
        return
    conn.execute(
        update(nodes_t)
        .where(nodes_t.c.name.in_([r.name for r in with_replicas]))
        .values(reports_replicas=True)
    )
    models = sorted({rep.model for r in with_replicas for rep in r.replicas or ()})
    if not models:
        return
    rows = {
        (row["model"], row["replica"]): row
        for row in conn.execute(select(placements_t).where(placements_t.c.model.in_(models)))
        .mappings()
        .all()
    }
    trail: list[TrailEntry] = []
    writes: list[tuple[str, int, str, dict[str, Any]]] = []
    cleared: list[tuple[str, str]] = []
    for report in with_replicas:
        for rep in report.replicas or ():
            row = rows.get((rep.model, rep.replica))
            nodes = json.loads(row["nodes"]) if row is not None else []
            if row is None or report.name not in nodes:
                log.info(
                    "placement.report_ignored",
                    node=report.name,
                    model=rep.model,
                    replica=rep.replica,
                    reason="no such replica is placed on this node",
                )
                continue
            changed = rep.state != row["state"]
            if not changed and rep.message == row["message"] and rep.endpoint == row["endpoint"]:
                continue
            values: dict[str, Any] = {"message": rep.message, "endpoint": rep.endpoint}
            if changed:
                values |= {"state": rep.state, "state_since": now}
                trail.append(
                    TrailEntry(
                        REPLICA_EVENT.format(state=rep.state),
                        rep.model,
                        rep.replica,
                        row["profile"],
                        nodes,
                        rep.message or f"reported {rep.state} by node {report.name}",
                        actor,
                    )
                )
                if rep.state == READY:
                    cleared.append((rep.model, report.name))
            writes.append((rep.model, rep.replica, row["nodes"], values))
    if not writes:
        return
    # Taken before any row is changed, in the order a round takes its locks,
    # so that a report and a round never wait for each other in a cycle.
    lock_trail(conn)
    for model, replica, nodes_text, values in writes:
        conn.execute(
            update(placements_t)
            .where(
                placements_t.c.model == model,
                placements_t.c.replica == replica,
                # Only the placement the agent reported on: not one placed since in its slot.
                placements_t.c.nodes == nodes_text,
            )
            .values(**values)
        )
    for model, node in cleared:
        conn.execute(
            delete(failures_t).where(failures_t.c.model == model, failures_t.c.node == node)
        )
    append_trail(conn, trail, now=now)


def read_statuses(conn: Connection) -> dict[tuple[str, int], ReplicaStatus]:
    """Every placement's state; a node whose agent never reported replicas counts as unreported."""
    reporting = {
        name
        for (name,) in conn.execute(
            select(nodes_t.c.name).where(nodes_t.c.reports_replicas.is_(True))
        )
    }
    out: dict[tuple[str, int], ReplicaStatus] = {}
    for r in conn.execute(select(placements_t)).mappings():
        nodes = json.loads(r["nodes"])
        out[(r["model"], r["replica"])] = ReplicaStatus(
            state=r["state"] or PLACED,
            since=r["state_since"] or r["placed_at"],
            placed_at=r["placed_at"],
            message=r["message"],
            endpoint=r["endpoint"],
            reported=any(n in reporting for n in nodes),
        )
    return out


def read_cordons(conn: Connection) -> dict[str, Cordon]:
    return {
        r["node"]: Cordon(r["node"], r["mode"], r["actor"], r["reason"], r["since"])
        for r in conn.execute(select(cordons_t).order_by(cordons_t.c.node)).mappings()
    }


def read_failures(conn: Connection) -> tuple[FailureRecord, ...]:
    return tuple(
        FailureRecord(r["model"], r["node"], r["failures"], r["last_failed_at"], r["last_reason"])
        for r in conn.execute(
            select(failures_t).order_by(failures_t.c.model, failures_t.c.node)
        ).mappings()
    )


def record_failures(conn: Connection, failed: Mapping[tuple[str, str], str], now: datetime) -> None:
    """Count one more failure of each (model, node), with its reason."""
    for (model, node), reason in sorted(failed.items()):
        row = conn.execute(
            select(failures_t.c.failures).where(
                failures_t.c.model == model, failures_t.c.node == node
            )
        ).first()
        if row is None:
            conn.execute(
                insert(failures_t),
                {
                    "model": model,
                    "node": node,
                    "failures": 1,
                    "last_failed_at": now,
                    "last_reason": reason,
                },
            )
        else:
            conn.execute(
                update(failures_t)
                .where(failures_t.c.model == model, failures_t.c.node == node)
                .values(failures=row[0] + 1, last_failed_at=now, last_reason=reason)
            )


def set_cordon(
    conn: Connection, node: str, mode: str | None, *, actor: str, reason: str, now: datetime
) -> Cordon | None:
    """Cordon, drain (``mode``) or uncordon (None) a node; the event says who and why.

    Returns the cordon as it was before. Setting the mode a node already has
    records nothing.
    """
    lock_trail(conn)
    before = read_cordons(conn).get(node)
    if (before.mode if before else None) == mode:
        return before
    if mode is None:
        conn.execute(delete(cordons_t).where(cordons_t.c.node == node))
        kind = NODE_UNCORDONED
    else:
        values = {"mode": mode, "actor": actor, "reason": reason, "since": now}
        if before is None:
            conn.execute(insert(cordons_t), {"node": node, **values})
        else:
            conn.execute(update(cordons_t).where(cordons_t.c.node == node).values(**values))
        kind = NODE_DRAINING if mode == "draining" else NODE_CORDONED
    append_trail(conn, [TrailEntry(kind, "", -1, "", [node], reason, actor)], now=now)
    return before


__all__ = [
    "FAILED",
    "NODE_CORDONED",
    "NODE_DRAINING",
    "NODE_UNCORDONED",
    "REPLICA_FAILED",
    "TrailEntry",
    "append_trail",
    "lock_trail",
    "read_cordons",
    "read_failures",
    "read_statuses",
    "record_failures",
    "record_replica_reports",
    "set_cordon",
]
