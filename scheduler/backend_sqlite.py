"""The scheduler on SQLite: one writer at a time by construction."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, Dialect, Table

# Bound values one statement may carry (SQLITE_MAX_VARIABLE_NUMBER's default).
_MAX_VARIABLES = 32766 if sqlite3.sqlite_version_info >= (3, 32) else 999
# Rows per statement: powers of two up to this, so a batch of any size is a few
# statements of a handful of shapes, each built (and prepared by SQLite) once.
_MAX_ROWS = 256


class SqliteBackend:
    def lock_numbering(self, conn: Connection) -> None:
        # A write transaction starts with BEGIN IMMEDIATE (events.db): it
        # already holds the only write lock there is.
        return

    def upsert(
        self, conn: Connection, table: Table, key: str, rows: Sequence[dict[str, Any]]
    ) -> None:
        """One multi-row ``INSERT ... ON CONFLICT DO UPDATE`` per power of two in the batch.

        ``executemany`` runs the statement once per row, and the sqlite3 module
        releases the GIL around each: under load the writer thread then waits for
        the event loop's thread once per row rather than once per statement. Rows
        are applied in order, so of two with the same key the later wins, as with
        ``executemany``.
        """
        columns = tuple(rows[0])
        most = max(1, min(_MAX_ROWS, _MAX_VARIABLES // len(columns)))
        at = 0
        while at < len(rows):
            size = min(most, 1 << ((len(rows) - at).bit_length() - 1))
            sql, processors = _upsert(table, key, columns, size, conn.dialect)
            chunk = rows[at : at + size]
            values = [
                value if process is None else process(value)
                for row in chunk
                for value, process in zip((row[c] for c in columns), processors, strict=True)
            ]
            conn.exec_driver_sql(sql, tuple(values))
            at += size


@functools.lru_cache(maxsize=64)
def _upsert(
    table: Table, key: str, columns: tuple[str, ...], rows: int, dialect: Dialect
) -> tuple[str, tuple[Callable[[Any], Any] | None, ...]]:
    # Written out rather than built with SQLAlchemy: a statement of 256 rows has
    # thousands of bound parameters, and building (and keying) it costs more than
    # running it. The columns' own bind processing (UTCDateTime) still applies.
    quote = dialect.identifier_preparer.quote
    one = "(" + ", ".join("?" * len(columns)) + ")"
    sql = (
        f"INSERT INTO {quote(table.name)} ({', '.join(quote(c) for c in columns)}) "
        f"VALUES {', '.join([one] * rows)} "
        f"ON CONFLICT ({quote(key)}) DO UPDATE SET "
        + ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in columns if c != key)
    )
    return sql, tuple(
        table.c[c].type.dialect_impl(dialect).bind_processor(dialect) for c in columns
    )


SQLITE = SqliteBackend()
