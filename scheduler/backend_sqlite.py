"""The scheduler on SQLite: one writer at a time by construction."""

from __future__ import annotations

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
        stmt = sqlite.insert(table)
        stmt = stmt.on_conflict_do_update(
            index_elements=[table.c[key]],
            set_={c: stmt.excluded[c] for c in rows[0] if c != key},
        )
        conn.execute(stmt, list(rows))


SQLITE = SqliteBackend()
