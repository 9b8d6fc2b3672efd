"""The ``placements`` table as read: each row a placement and what its agent last said.

One reader for every use (a round's state, replica reports, `nodes list`'s
counts), so that a row that cannot be read is skipped and named the same way
everywhere (``scheduler.persistence.row_decoding``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, tuple_, update

from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.persistence.record_format import checked, names, replica_state
from scheduler.persistence.row_decoding import Row, decode_rows, json_column, raw
from scheduler.persistence.tables import NodeRow, PlacementChangesRow, PlacementRow, table
from scheduler.planner.fleet.placements import Placement

nodes_t = table(NodeRow)
placements_t = table(PlacementRow)
changes_t = table(PlacementChangesRow)


@dataclass(frozen=True, slots=True)
class StoredPlacement:
    placement: Placement
    state: str
    since: datetime
    placed_at: datetime
    message: str
    endpoint: str | None
    # The nodes column exactly as stored: a report updates only the placement it was about.
    nodes_text: str
    effective_context_length: int | None = None
    context_detail: str = ""

    def status(self, reporting: frozenset[str]) -> ReplicaStatus:
        return ReplicaStatus(
            state=self.state,
            since=self.since,
            placed_at=self.placed_at,
            message=self.message,
            endpoint=self.endpoint,
            reported=any(n in reporting for n in self.placement.nodes),
            effective_context_length=self.effective_context_length,
            context_detail=self.context_detail,
        )


def next_change(conn: Connection) -> int:
    """The change sequence number for this transaction's writes to placements: call under
    the numbering lock (``audit_trail.lock_trail``), which orders the numbers as the
    commits (``scheduler.persistence.placement_changes``)."""
    conn.execute(update(changes_t).where(changes_t.c.id == 1).values(seq=changes_t.c.seq + 1))
    return int(conn.execute(select(changes_t.c.seq).where(changes_t.c.id == 1)).scalar_one())


def reporting_changed(conn: Connection) -> None:
    """Say that the set of nodes reporting replica states changed (``reporting_nodes``)."""
    conn.execute(
        update(changes_t).where(changes_t.c.id == 1).values(reporting=changes_t.c.reporting + 1)
    )


def placement_row(p: Placement, round_id: int, now: datetime, seq: int = 0) -> dict[str, Any]:
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
        "version": p.version,
        "moving": p.moving,
        "moving_for": p.moving_for,
        "state": "placed",
        "state_since": now,
        "change_seq": seq,
    }


def read_placements(
    conn: Connection,
    models: Sequence[str] | None = None,
    *,
    keys: Sequence[tuple[str, int]] | None = None,
    node: str | None = None,
    since: int | None = None,
) -> list[StoredPlacement]:
    """Every readable placement (of ``models``, or with the (model, replica) ``keys``, or
    written after change ``since``, or on ``node``, if given), by model and replica."""
    query = raw(placements_t).order_by(placements_t.c.model, placements_t.c.replica)
    if models is not None:
        query = query.where(placements_t.c.model.in_(models))
    if keys is not None:
        query = query.where(tuple_(placements_t.c.model, placements_t.c.replica).in_(keys))
    if since is not None:
        query = query.where(placements_t.c.change_seq > since)
    if node is not None:
        # The nodes column is a JSON list: the name, quoted, is in the text of exactly the
        # rows that list it (a name has no quote); held exactly once decoded, below.
        query = query.where(placements_t.c.nodes.contains(json.dumps(node), autoescape=True))
        found = decode_rows(
            conn,
            query,
            table="placements",
            key=("model", "replica"),
            decode=_placement,
            times=("placed_at",),
            nullable_times=("state_since",),
        )
        return [r for r in found if node in r.placement.nodes]
    return decode_rows(
        conn,
        query,
        table="placements",
        key=("model", "replica"),
        decode=_placement,
        times=("placed_at",),
        nullable_times=("state_since",),
    )


def reporting_nodes(conn: Connection, among: Sequence[str] | None = None) -> frozenset[str]:
    """Nodes (of ``among``, if given) whose agent reports replica states; the others'
    replicas count as unreported."""
    query = select(nodes_t.c.name).where(nodes_t.c.reports_replicas.is_(True))
    if among is not None:
        query = query.where(nodes_t.c.name.in_(among))
    return frozenset(name for (name,) in conn.execute(query))


def _placement(r: Row) -> StoredPlacement:
    nodes_text = checked(r, "nodes", str)
    placement = Placement(
        model=checked(r, "model", str),
        replica=checked(r, "replica", int),
        profile=checked(r, "profile", str),
        nodes=names(json_column(nodes_text, "nodes")),
        gpus_per_node=checked(r, "gpus_per_node", int),
        gpu_class=checked(r, "gpu_class", str, None),
        memory_gb_per_node=checked(r, "memory_gb_per_node", int),
        fingerprint=checked(r, "fingerprint", str),
        version=checked(r, "version", str),
        moving=checked(r, "moving", str),
        moving_for=checked(r, "moving_for", str),
    )
    return StoredPlacement(
        placement=placement,
        state=replica_state(r),
        since=r["state_since"] or r["placed_at"],
        placed_at=r["placed_at"],
        message=checked(r, "message", str),
        endpoint=checked(r, "endpoint", str, None),
        nodes_text=nodes_text,
        effective_context_length=checked(r, "effective_context_length", int, None),
        context_detail=checked(r, "context_detail", str),
    )
