"""The placements' audit trail: every replica placed, removed, updated or reported, and why.

Rounds, replica reports, cordons and drains all append here, numbered in one
gapless sequence under one lock (``Backend.lock_numbering``), so that
``history --placements`` tells one story in one order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import Connection, func, insert, select

from scheduler.persistence.backend import backend
from scheduler.persistence.record_format import PlacementEvent, checked, names
from scheduler.persistence.row_decoding import (
    Row,
    Unreadable,
    decode_one,
    decode_rows,
    json_column,
    raw,
)
from scheduler.persistence.tables import PlacementEventRow, PlacementRoundRow, table

pevents_t = table(PlacementEventRow)
rounds_t = table(PlacementRoundRow)

# What a round does to a replica.
PLACED = "placement.placed"
REMOVED = "placement.removed"
UPDATED = "placement.updated"
# What happens to a replica between rounds, and to nodes.
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
    """The lock under which rounds and placement events are numbered."""
    backend(conn).lock_numbering(conn)


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


def read_events(
    conn: Connection,
    *,
    model: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    round_id: int | None = None,
    after: int = 0,
    limit: int | None = None,
) -> list[PlacementEvent]:
    """Placement events in order, optionally filtered; unreadable rows are skipped and named.

    ``after`` and ``limit``: a follower's next page (positions are gapless and
    commit-ordered: appended under ``lock_trail``).
    """
    query = raw(pevents_t).where(pevents_t.c.position > after).order_by(pevents_t.c.position)
    if limit is not None:
        query = query.limit(limit)
    if round_id is not None:
        query = query.where(pevents_t.c.round_id == round_id)
    if model is not None:
        query = query.where(pevents_t.c.model == model)
    if since is not None:
        query = query.where(pevents_t.c.recorded_at >= since)
    if until is not None:
        query = query.where(pevents_t.c.recorded_at <= until)
    return decode_rows(
        conn,
        query,
        table="placement_events",
        key=("position",),
        decode=_event,
        times=("recorded_at",),
    )


def follow_page(conn: Connection, *, after: int, limit: int) -> list[PlacementEvent | Unreadable]:
    """The next ``limit`` rows past ``after``, in order: each an event, or, when it cannot
    be read, why not (named as ``read_events`` names it).

    For a follower: a page of unreadable rows must still move it on. ``read_events``
    leaves them out, so a page made only of them looked like "nothing new" and the
    follower read the same page again at every poll, never reaching the rows after it.
    """
    rows = (
        conn.execute(
            raw(pevents_t)
            .where(pevents_t.c.position > after)
            .order_by(pevents_t.c.position)
            .limit(limit)
        )
        .mappings()
        .all()
    )
    return [
        decode_one(
            conn,
            row,
            table="placement_events",
            key=("position",),
            decode=_event,
            times=("recorded_at",),
        )
        for row in rows
    ]


class Move(NamedTuple):
    """A placement a round added (``PLACED``) or deleted (``REMOVED``), and its nodes."""

    type: str
    nodes: tuple[str, ...]


def moves_between(conn: Connection, *, after_round: int, through_round: int) -> list[Move] | None:
    """The placements rounds ``after_round`` + 1 to ``through_round`` added or deleted
    (``placement.placed`` and ``placement.removed``, with their nodes); None if any of
    those rows cannot be read, so that a caller keeping counts reads the placements
    whole instead of missing a move.

    Only the type and the nodes are read, not whole events: a round of 100,000
    placements is 100,000 events, and decoding each whole took a loaded server's report
    writer minutes, past the database's idle-in-transaction limit (the batch failed, and
    the next read them again)."""
    rows = conn.execute(
        select(pevents_t.c.type, pevents_t.c.nodes)
        .where(
            pevents_t.c.round_id > after_round,
            pevents_t.c.round_id <= through_round,
            pevents_t.c.type.in_((PLACED, REMOVED)),
        )
        .order_by(pevents_t.c.position)
    ).all()
    moves = []
    for kind, text in rows:
        try:
            nodes = json.loads(text)
        except (TypeError, ValueError, RecursionError):  # (nested past the parser)
            return None
        if not (isinstance(nodes, list) and all(isinstance(n, str) for n in nodes)):
            return None
        moves.append(Move(kind, tuple(nodes)))
    return moves


def nodes_named_after(
    conn: Connection, *, after: int, limit: int
) -> list[tuple[int, tuple[str, ...] | None]]:
    """The next ``limit`` events past ``after``, in order, as (position, the nodes it
    names), None for nodes that cannot be read: what a follower of which nodes moved needs
    (``llmgw.api.reports.placement_generations``), without decoding whole events (a round
    of 100,000 placements is 100,000 of them)."""
    rows = conn.execute(
        select(pevents_t.c.position, pevents_t.c.nodes)
        .where(pevents_t.c.position > after)
        .order_by(pevents_t.c.position)
        .limit(limit)
    ).all()
    named: list[tuple[int, tuple[str, ...] | None]] = []
    for position, text in rows:
        try:
            nodes = json.loads(text)
        except (TypeError, ValueError, RecursionError):  # (nested past the parser)
            nodes = None
        ok = isinstance(nodes, list) and all(isinstance(n, str) for n in nodes)
        named.append((int(position), tuple(nodes) if ok else None))
    return named


def events_head(conn: Connection) -> int:
    """The last placement event's position (0 for none)."""
    return int(conn.execute(select(func.coalesce(func.max(pevents_t.c.position), 0))).scalar_one())


def _event(r: Row) -> PlacementEvent:
    return PlacementEvent(
        position=checked(r, "position", int),
        round_id=checked(r, "round_id", int),
        type=checked(r, "type", str),
        model=checked(r, "model", str),
        replica=checked(r, "replica", int),
        profile=checked(r, "profile", str),
        nodes=names(json_column(r["nodes"], "nodes")),
        reason=checked(r, "reason", str),
        catalog_position=checked(r, "catalog_position", int),
        recorded_at=r["recorded_at"],
        actor=checked(r, "actor", str),
    )
