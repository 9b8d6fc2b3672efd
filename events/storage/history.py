"""History queries over the log in SQL: ``llmgw history`` and the API's filters.

Filtered in SQL (by model, actor, type and time) rather than by reading the
whole log, and streamed in batches like every read of the log. Rows are decoded by
``events.core.rows.decode``, the tolerant decoder replay uses: a stored row whose columns
are not their types (SQLite keeps whatever it is given) is still listed, marked
unreadable with the reason, never a crash of ``llmgw history`` or the API.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select

from events.core.rows import decode
from events.core.types import StoredEvent
from events.storage import sql_reads
from events.storage.sql_reads import _COLUMNS, RAW_RECORDED_AT, recorded_at_from_db, t


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """Which events ``history`` returns; every filter given must hold.

    ``model``, ``actor`` and ``type`` match exactly (a model by the name the
    event recorded); ``without_type`` leaves that type out (``llmgw history`` leaves
    the usage ledger's ``usage.recorded`` out unless asked); ``since`` and ``until``
    bound ``recorded_at``, both inclusive.
    """

    model: str | None = None
    actor: str | None = None
    type: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    without_type: str | None = None


def _conditions(query: HistoryQuery, after: int) -> list[Any]:
    conditions: list[Any] = [t.c.position > after]
    if query.model is not None:
        conditions.append(t.c.model == query.model)
    if query.actor is not None:
        conditions.append(t.c.actor == query.actor)
    if query.type is not None:
        conditions.append(t.c.type == query.type)
    if query.without_type is not None:
        conditions.append(t.c.type != query.without_type)
    if query.since is not None:
        conditions.append(t.c.recorded_at >= query.since)
    if query.until is not None:
        conditions.append(t.c.recorded_at <= query.until)
    return conditions


def history(engine: Engine, query: HistoryQuery, after: int = 0) -> Iterator[StoredEvent]:
    """The events matching ``query``, in log order, filtered in SQL and streamed in batches."""
    conditions = _conditions(query, after)
    columns = [*_COLUMNS[:-1], RAW_RECORDED_AT]
    convert = recorded_at_from_db(engine.dialect)
    while True:
        select_batch = (
            select(*columns).where(*conditions).order_by(t.c.position).limit(sql_reads.READ_BATCH)
        )
        with engine.connect() as conn:
            rows = conn.execute(select_batch).all()
        for row in rows:
            yield decode(row, convert)
        if len(rows) < sql_reads.READ_BATCH:
            return
        conditions[0] = t.c.position > rows[-1][0]


def newest(engine: Engine, query: HistoryQuery, count: int) -> list[StoredEvent]:
    """The last ``count`` events matching ``query``, in log order (the dashboard's
    History page: the newest catalog changes, however many usage events came since)."""
    columns = [*_COLUMNS[:-1], RAW_RECORDED_AT]
    convert = recorded_at_from_db(engine.dialect)
    stmt = select(*columns).where(*_conditions(query, 0)).order_by(t.c.position.desc()).limit(count)
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    return [decode(row, convert) for row in reversed(rows)]


def usage_events(engine: Engine, since: datetime | None = None) -> Iterator[StoredEvent]:
    """The ``usage.recorded`` events, in log order; with ``since``, those recorded from
    the start of its minute on (a row's minute is always before its event's time, so
    these hold every row of a minute from ``since``'s on: events.read.ledger filters)."""
    from events.core.types import USAGE_RECORDED

    if since is not None:
        since = since.replace(second=0, microsecond=0)
    return history(engine, HistoryQuery(type=USAGE_RECORDED, since=since))
