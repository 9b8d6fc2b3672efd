"""History queries over the log in SQL: ``llmgw history`` and the API's filters.

Filtered in SQL (by model, actor, type and time) rather than by reading the
whole log, and streamed in batches like every read of the log.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, select

from events import sql_reads
from events.rows import to_event
from events.sql_reads import _COLUMNS, t
from events.types import StoredEvent


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """Which events ``history`` returns; every filter given must hold.

    ``model``, ``actor`` and ``type`` match exactly (a model by the name the
    event recorded); ``since`` and ``until`` bound ``recorded_at``, both
    inclusive.
    """

    model: str | None = None
    actor: str | None = None
    type: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def history(engine: Engine, query: HistoryQuery, after: int = 0) -> Iterator[StoredEvent]:
    """The events matching ``query``, in log order, filtered in SQL and streamed in batches."""
    conditions = [t.c.position > after]
    if query.model is not None:
        conditions.append(t.c.model == query.model)
    if query.actor is not None:
        conditions.append(t.c.actor == query.actor)
    if query.type is not None:
        conditions.append(t.c.type == query.type)
    if query.since is not None:
        conditions.append(t.c.recorded_at >= query.since)
    if query.until is not None:
        conditions.append(t.c.recorded_at <= query.until)
    while True:
        select_batch = (
            select(*_COLUMNS).where(*conditions).order_by(t.c.position).limit(sql_reads.READ_BATCH)
        )
        with engine.connect() as conn:
            rows = conn.execute(select_batch).all()
        for row in rows:
            yield to_event(row)
        if len(rows) < sql_reads.READ_BATCH:
            return
        conditions[0] = t.c.position > rows[-1][0]
