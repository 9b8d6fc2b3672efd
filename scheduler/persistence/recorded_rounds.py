"""Recorded rounds: writing the exact inputs of a round's plan, and rebuilding them.

``explain --round`` plans a recorded round again from what is kept here. The
JSON is versioned and upcast (``scheduler.persistence.record_format``); a round whose row cannot
be read is skipped and named, and asking for the last round (or the last at a
time) then gives the one before it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection, insert, select

from scheduler.lifecycle.inputs import Lifecycle
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.record_format import (
    RecordedRound,
    UnreadableRow,
    inventory_digest,
    inventory_json,
    placement_record,
    policy_json,
    recorded_round,
)
from scheduler.persistence.row_decoding import (
    STORED_LIMITS,
    Row,
    Unreadable,
    decode_each,
    decode_one,
    json_column,
    raw,
)
from scheduler.persistence.tables import InventoryRow, PlacementRoundRow, table
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Placement

rounds_t = table(PlacementRoundRow)
inventories_t = table(InventoryRow)

# Rounds fetched at a time while looking back for one that can be read.
SEARCH_BATCH = 50


class RoundUnreadable(Exception):
    """A recorded round that exists but cannot be read, with the reason (as
    ``scheduler.row_skipped`` logs it)."""

    def __init__(self, round_id: int, reason: str) -> None:
        super().__init__(f"round {round_id} is recorded but cannot be read: {reason}")
        self.round_id = round_id
        self.reason = reason


def record_round(
    conn: Connection,
    *,
    round_id: int,
    now: datetime,
    catalog_position: int,
    nodes: Sequence[Node],
    current: Sequence[Placement],
    policy: StalenessPolicy,
    lifecycle: Lifecycle,
    counts: tuple[int, int, int],
    leader: tuple[str, int] | None = None,
) -> None:
    """Write a round's row, and its inventory unless one with the same digest is stored;
    ``leader``: the holder and epoch of the leadership lease it was written under."""
    digest = inventory_digest(nodes)
    stored = conn.execute(
        select(inventories_t.c.digest).where(inventories_t.c.digest == digest)
    ).first()
    if stored is None:
        conn.execute(insert(inventories_t), {"digest": digest, "nodes": inventory_json(nodes)})
    placed, removed, unplaced = counts
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
            "current": json.dumps([placement_record(p) for p in current]),
            "policy": policy_json(policy),
            "placed": placed,
            "removed": removed,
            "unplaced": unplaced,
            "lifecycle": json.dumps(lifecycle.to_json()),
            "leader": None if leader is None else leader[0],
            "epoch": None if leader is None else leader[1],
        },
    )


def read_recorded_round(
    conn: Connection, *, round_id: int | None = None, at: datetime | None = None
) -> RecordedRound | None:
    """A recorded round by id, or the last readable one planned at or before ``at``, or the last.

    None when no such round is recorded. A round asked for by id whose row cannot be
    read raises ``RoundUnreadable``: "not recorded" would send an operator looking
    for a round that is there (the reason is otherwise only in the server's log).
    """
    query = raw(rounds_t)
    if round_id is not None:
        row = conn.execute(query.where(rounds_t.c.id == round_id)).mappings().first()
        if row is None:
            return None
        found = decode_one(
            conn,
            row,
            table="placement_rounds",
            key=("id",),
            decode=lambda r: _round(conn, r),
            times=("planned_at",),
        )
        if isinstance(found, Unreadable):
            raise RoundUnreadable(round_id, found.reason)
        return found
    if at is not None:
        query = query.where(rounds_t.c.planned_at <= at)
    query = query.order_by(rounds_t.c.id.desc())
    offset = 0
    while True:
        batch = conn.execute(query.limit(SEARCH_BATCH).offset(offset)).mappings().all()
        if not batch:
            return None
        for row in batch:
            readable = decode_each(
                conn,
                [row],
                table="placement_rounds",
                key=("id",),
                decode=lambda r: _round(conn, r),
                times=("planned_at",),
            )
            if readable:
                return readable[0]
        offset += SEARCH_BATCH


def _round(conn: Connection, r: Row) -> RecordedRound:
    digest = r["inventory_digest"]
    content = conn.execute(
        raw(inventories_t, "nodes").where(inventories_t.c.digest == digest)
    ).scalar()
    if content is None:
        raise UnreadableRow(f"its inventory {digest!r} is not stored")
    documents = {
        name: json_column(r[name], name, STORED_LIMITS)
        for name in ("reported_at", "current", "policy")
    }
    documents["lifecycle"] = (
        None if r["lifecycle"] is None else json_column(r["lifecycle"], "lifecycle")
    )
    return recorded_round(r, documents, json_column(content, "inventory nodes", STORED_LIMITS))
