"""The last round's unplaced replicas and their reasons, as the daemon left them.

One row (``placement_outcome``), replaced whole by the round that changes it, so
that every API replica answers ``GET /v1/fleet`` with the daemon's own reasons for
the price of a read, not a round planned per request. Read like every scheduler
row: bounded, and a row that cannot be read is named (``scheduler.row_skipped``)
and answered as unreadable, never a crash.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, func, select

from catalog.reading.documents import Limits
from scheduler.persistence.backend import backend
from scheduler.persistence.record_format import UnreadableRow
from scheduler.persistence.row_decoding import Row, Unreadable, decode_one, json_column, raw
from scheduler.persistence.tables import PlacementOutcomeRow, PlacementRoundRow, table
from scheduler.planner.fleet.placements import Unplaced

outcome_t = table(PlacementOutcomeRow)
rounds_t = table(PlacementRoundRow)
ROW_ID = 1
# Tens of thousands of unplaced replicas with their reasons fit; a row past this is
# not one the daemon wrote.
OUTCOME_LIMITS = Limits(max_bytes=32 << 20, max_depth=8, max_nodes=2_000_000)


@dataclass(frozen=True, slots=True)
class UnplacedReason:
    model: str
    replica: int
    reason: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a round left unplaced; it held in every round since ``planned_at``."""

    planned_at: datetime
    catalog_position: int
    round_id: int
    unplaced: tuple[UnplacedReason, ...]


def reasons_of(unplaced: Sequence[Unplaced]) -> tuple[UnplacedReason, ...]:
    return tuple(UnplacedReason(u.model, u.replica, u.reason) for u in unplaced)


def write_outcome(
    conn: Connection,
    unplaced: Sequence[UnplacedReason],
    *,
    planned_at: datetime,
    catalog_position: int,
) -> None:
    round_id = conn.execute(select(func.coalesce(func.max(rounds_t.c.id), 0))).scalar_one()
    row = {
        "id": ROW_ID,
        "planned_at": planned_at,
        "catalog_position": catalog_position,
        "round_id": int(round_id),
        "unplaced": json.dumps(
            [{"model": u.model, "replica": u.replica, "reason": u.reason} for u in unplaced]
        ),
    }
    backend(conn).upsert(conn, outcome_t, "id", [row])


def read_outcome(conn: Connection) -> Outcome | Unreadable | None:
    """The stored outcome; None before the daemon's first round; Unreadable, named, if
    the row holds what no round wrote."""
    row = conn.execute(raw(outcome_t).where(outcome_t.c.id == ROW_ID)).mappings().first()
    if row is None:
        return None
    return decode_one(
        conn, row, table="placement_outcome", key=("id",), decode=_outcome, times=("planned_at",)
    )


def _outcome(r: Row) -> Outcome:
    items = json_column(r["unplaced"], "unplaced", OUTCOME_LIMITS)
    if not isinstance(items, list):
        raise UnreadableRow("unplaced is not a list")
    reasons = []
    for item in items:
        if not isinstance(item, dict) or set(item) != {"model", "replica", "reason"}:
            raise UnreadableRow("an unplaced entry is not {model, replica, reason}")
        model, replica, reason = item["model"], item["replica"], item["reason"]
        if type(model) is not str or type(replica) is not int or type(reason) is not str:
            raise UnreadableRow(f"unplaced entry {str(model)[:60]!r} has a value of a wrong type")
        reasons.append(UnplacedReason(model, replica, reason))
    position, round_id = r["catalog_position"], r["round_id"]
    if type(position) is not int or type(round_id) is not int:
        raise UnreadableRow("catalog_position and round_id must be integers")
    return Outcome(r["planned_at"], position, round_id, tuple(reasons))
