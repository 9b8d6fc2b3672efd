"""The scheduler on PostgreSQL: several control-plane replicas may write at once."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.dialects import postgresql


class PostgresqlBackend:
    def lock_numbering(self, conn: Connection) -> None:
        # Rounds and placement events are numbered max + 1: two writers must
        # not read the same max. Readers are not blocked (EXCLUSIVE, not ACCESS).
        conn.exec_driver_sql("LOCK TABLE placement_rounds IN EXCLUSIVE MODE")

    def upsert(
        self, conn: Connection, table: Table, key: str, rows: Sequence[dict[str, Any]]
    ) -> None:
        conn.execute(_upsert(table, key, tuple(rows[0])), list(rows))


@functools.lru_cache(maxsize=32)
def _upsert(table: Table, key: str, columns: tuple[str, ...]) -> Any:
    # Built once per shape: node reports upsert a batch every few milliseconds, and
    # building the statement (and its cache key) was a fifth of what a batch cost.
    stmt = postgresql.insert(table)
    return stmt.on_conflict_do_update(
        index_elements=[table.c[key]],
        set_={c: stmt.excluded[c] for c in columns if c != key},
    )


POSTGRESQL = PostgresqlBackend()
