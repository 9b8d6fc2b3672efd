"""The hash chain's columns in SQL: what ``verify``, the snapshot checks and an append read.

The chain itself (the hash, the verifier) is events.core.chain, pure; this reads
its rows, its seal and its adoptions from the database (an append reads the
seal and adoptions on its own connection: events.storage.sql_log).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine, Table, select

from events.core.chain import ChainRow, Seal
from events.core.rows import decode
from events.database.tables import ChainAdoptionRow, ChainSealRow, EventRow
from events.storage.sql_reads import RAW_RECORDED_AT, recorded_at_from_db

READ_BATCH = 5_000
t: Table = EventRow.__table__  # type: ignore[assignment]  # declarative tables are Tables
seal_table: Table = ChainSealRow.__table__  # type: ignore[assignment]
adoption_table: Table = ChainAdoptionRow.__table__  # type: ignore[assignment]

_CHAIN_COLUMNS = (
    t.c.position,
    t.c.event_id,
    t.c.command_id,
    t.c.type,
    t.c.schema_version,
    t.c.model,
    t.c.payload,
    t.c.actor,
    t.c.reason,
    RAW_RECORDED_AT,  # converted in decode(), so a value that is not a time is named
    t.c.prev_hash,
    t.c.hash,
)


def read_chain(engine: Engine, after: int = 0) -> Iterator[ChainRow]:
    """Every event with its chain columns, in order, for ``llmgw verify``."""
    last = after
    convert = recorded_at_from_db(engine.dialect)
    while True:
        query = (
            select(*_CHAIN_COLUMNS)
            .where(t.c.position > last)
            .order_by(t.c.position)
            .limit(READ_BATCH)
        )
        with engine.connect() as conn:
            rows: list[Any] = list(conn.execute(query).all())
        for row in rows:
            yield _chain_row(row, convert)
        if len(rows) < READ_BATCH:
            return
        last = rows[-1][0]


def _chain_row(row: Any, convert: Any) -> ChainRow:
    e = decode(row[:10], convert)
    prev_hash, hash_ = row[10], row[11]
    unreadable = e.unreadable
    if unreadable is None and not all(h is None or type(h) is str for h in (prev_hash, hash_)):
        unreadable = "prev_hash or hash is not text"
    return ChainRow(
        e.position,
        e.event_id,
        e.command_id,
        e.type,
        e.schema_version,
        e.model,
        e.payload,
        e.actor,
        e.reason,
        e.recorded_at,
        prev_hash if unreadable is None else None,
        hash_ if unreadable is None else None,
        unreadable,
    )


def read_seal(engine: Engine) -> Seal | None:
    """Where the hash chain starts (see events.core.chain); None if the row is missing."""
    with engine.connect() as conn:
        row = conn.execute(
            select(seal_table.c.position, seal_table.c.hash, seal_table.c.sealed_at)
        ).first()
    return None if row is None else Seal(int(row[0]), row[1], row[2])


def hash_at(engine: Engine, position: int) -> str | None:
    """The stored chain hash of one event (None: no such event, or written before the chain)."""
    with engine.connect() as conn:
        return conn.execute(select(t.c.hash).where(t.c.position == position)).scalar()
