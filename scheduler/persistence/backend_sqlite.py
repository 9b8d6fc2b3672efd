"""The scheduler on SQLite: one writer at a time by construction."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.dialects import sqlite


class SqliteBackend:
    def lock_numbering(self, conn: Connection) -> None:
        # A write transaction starts with BEGIN IMMEDIATE (events.db): it
        # already holds the only write lock there is.
        return

    def upsert(
        self, conn: Connection, table: Table, key: str, rows: Sequence[dict[str, Any]]
    ) -> None:
        conn.execute(_upsert(table, key, tuple(rows[0])), list(rows))


@functools.lru_cache(maxsize=32)
def _upsert(table: Table, key: str, columns: tuple[str, ...]) -> Any:
    # Built once per shape: node reports upsert a batch every few milliseconds, and
    # building the statement (and its cache key) was a fifth of what a batch cost.
    stmt = sqlite.insert(table)
    return stmt.on_conflict_do_update(
        index_elements=[table.c[key]],
        set_={c: stmt.excluded[c] for c in columns if c != key},
    )


SQLITE = SqliteBackend()
