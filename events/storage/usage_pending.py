"""The usage rows gateways flushed that the roll-up has not yet summed into events
(the ``usage_pending`` table, events.write.usage): read as stored, for the ledger's
reads to add to the events (events.read.ledger.read_pending judges each)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Table, select

from events.database.tables import UsagePendingRow
from events.storage import sql_reads

p: Table = UsagePendingRow.__table__  # type: ignore[assignment]  # declarative tables are Tables


@dataclass(frozen=True, slots=True)
class PendingRow:
    """One stored row as the driver gives it: ``row`` should be JSON text, ``poster``
    a name; neither is trusted (SQLite keeps whatever it is given)."""

    id: int
    poster: Any
    row: Any


def pending_rows(engine: Engine, since: datetime | None = None) -> Iterator[PendingRow]:
    """The pending rows (with ``since``, of the minutes from its minute on), in id order,
    streamed in batches."""
    after = 0
    while True:
        query = select(p.c.id, p.c.poster, p.c.row).where(p.c.id > after)
        if since is not None:
            query = query.where(p.c.minute >= since.replace(second=0, microsecond=0))
        query = query.order_by(p.c.id).limit(sql_reads.READ_BATCH)
        with engine.connect() as conn:
            rows = conn.execute(query).all()
        for row in rows:
            yield PendingRow(int(row[0]), row[1], row[2])
        if len(rows) < sql_reads.READ_BATCH:
            return
        after = int(rows[-1][0])
