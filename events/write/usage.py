"""A gateway's flush of usage counts, stored pending; the roll-up that sums the pending
rows of every closed minute into ``usage.recorded`` events of the log.

``record_usage``: the flush's id (``usage_flushes``, keyed by who posted and the id)
and its rows (``usage_pending``) in one transaction: durable when it returns, and the
same flush sent again (its answer lost, a timeout) stores nothing (``already_recorded``).
Another gateway's flush ids cannot collide (the poster is the gateway token's name and
worker, never the body's). A flush is a gateway's own, checked by the route first.

``roll_up``: in one write section of the log (its lock held: several control planes on
one PostgreSQL take turns, and SQLite has one writer), the pending rows of the minutes
closed at ``now`` (the minute's end and ``grace`` past) are read, summed per (minute,
client, model asked, served, replica) over all flushes of all gateways into one event
each, appended, and deleted: all or nothing, so no row is summed twice or lost. A row
that cannot be read is left in the table, skipped and named (``skipped``); the reads
name it too. Flush ids older than ``FLUSH_MEMORY`` are forgotten then.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Table, delete, insert, select, text
from sqlalchemy.exc import IntegrityError

from events.core.usage import UsageRow, event_for, key_of, minute_text, summed_within_bounds
from events.database.tables import UsageFlushRow
from events.read.ledger import pending_id, read_pending
from events.storage.sql_log import SqlLog
from events.storage.usage_pending import PendingRow, p

f: Table = UsageFlushRow.__table__  # type: ignore[assignment]  # declarative tables are Tables

# What a closed minute waits for late flushes (a gateway flushes every second).
GRACE = timedelta(seconds=5)
# How long a flush's id is remembered (a retried flush past it would count again; a
# gateway retries for seconds, not a day).
FLUSH_MEMORY = timedelta(days=1)
# Pending rows one roll-up pass reads at most (the rest are the next pass's).
MAX_PASS = 20_000
# Ids one DELETE names at most (SQLite's bound parameters).
_CHUNK = 500
ACTOR = "usage-rollup"


def record_usage(
    engine: Engine, poster: str, flush: str, rows: Sequence[UsageRow], now: datetime | None = None
) -> bool:
    """Store ``rows`` of ``poster``'s flush ``flush``; False when it was stored before."""
    when = now or datetime.now(UTC)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(f).values(poster=poster, flush=flush, rows=len(rows), received_at=when)
            )
            if rows:
                conn.execute(
                    insert(p),
                    [
                        {
                            "poster": poster,
                            "flush": flush,
                            "minute": row.minute,
                            "row": _row_text(row),
                            "received_at": when,
                        }
                        for row in rows
                    ],
                )
    except IntegrityError:
        return False
    return True


def _row_text(row: UsageRow) -> str:
    payload = row.payload()
    del payload["gateways"], payload["flushes"]
    return json.dumps(payload, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Skipped:
    name: str
    reason: str


@dataclass(slots=True)
class RollUp:
    """What one roll-up did: the rows summed and deleted, the events appended (their
    first and last positions), the rows left unreadable."""

    rows: int = 0
    events: int = 0
    positions: tuple[int, int] | None = None
    skipped: list[Skipped] = field(default_factory=list)
    minutes: list[str] = field(default_factory=list)
    # The rows read (summed or skipped), and the highest id among them.
    read: int = 0
    last_id: int = 0


def closed_before(now: datetime, grace: timedelta = GRACE) -> datetime:
    """Minutes before this one are closed at ``now``: their end and ``grace`` past."""
    edge = now.astimezone(UTC) - grace - timedelta(minutes=1)
    return edge.replace(second=0, microsecond=0) + timedelta(minutes=1)


def roll_up(
    store: SqlLog,
    now: datetime | None = None,
    grace: timedelta = GRACE,
    *,
    after: int = 0,
    most: int = MAX_PASS,
) -> RollUp:
    """Sum the closed minutes' pending rows into events (one pass, at most ``most``
    rows, those of ids above ``after``); with ``now`` far ahead (a graceful stop), every
    pending row. A pass that read ``most`` rows says where it stopped (``last_id``): the
    next pass starts after it, so the unreadable rows a pass leaves (named, kept for an
    operator) are not read again first by every pass, and never hold back the rows
    behind them however many they are."""
    when = now or datetime.now(UTC)
    before = closed_before(when, grace)
    done = RollUp()
    with store.writing() as section:
        stored = section.execute(
            select(p.c.id, p.c.poster, p.c.row)
            .where(p.c.minute < before, p.c.id > after)
            .order_by(p.c.id)
            .limit(most)
        )
        groups: dict[tuple[Any, ...], list[UsageRow]] = {}
        good: list[int] = []
        for values in stored:
            row = PendingRow(int(values[0]), values[1], values[2])
            done.read += 1
            done.last_id = row.id
            try:
                read = read_pending(row)
            except Exception as exc:  # one bad row is one bad row: left, named
                done.skipped.append(Skipped(pending_id(row), str(exc)[:300]))
                continue
            good.append(row.id)
            groups.setdefault(key_of(read), []).append(read)
        if groups:
            events = [
                event_for(part)
                for key in sorted(groups)
                for part in summed_within_bounds(groups[key])
            ]
            outcome = section.append(
                events,
                expected_head=None,
                actor=ACTOR,
                reason=f"usage of {len(good)} flushed rows, summed",
            )
            done.positions = (outcome.events[0].position, outcome.events[-1].position)
            done.events = len(events)
            done.minutes = sorted({minute_text(key[0]) for key in groups})
        for start in range(0, len(good), _CHUNK):
            # The ids written out (whole numbers, read as int above): a write section's
            # statements are compiled plain (no expanding IN), and 500 bound
            # parameters cost more CPU to compile than the rows to sum. By id, never
            # by minute: a late flush committed meanwhile is not deleted unsummed.
            ids = ",".join(str(i) for i in good[start : start + _CHUNK])
            section.execute(text(f"DELETE FROM usage_pending WHERE id IN ({ids})"))
        done.rows = len(good)
        section.execute(delete(f).where(f.c.received_at < when - FLUSH_MEMORY))
    return done
