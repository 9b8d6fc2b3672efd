"""What differs between the scheduler's back ends, chosen once per connection.

Everything else the scheduler stores is the same SQL on SQLite and PostgreSQL.
Two things are not: how rounds and placement events are locked while they are
numbered, and which dialect's INSERT ... ON CONFLICT builds an upsert. One class
does the work; each back end is one instance naming only those two differences,
so no other module asks which database it talks to.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Table, case, or_


@dataclass(frozen=True, slots=True)
class Backend:
    # The SQLAlchemy dialect, whose insert() has on_conflict_do_update.
    dialect: str
    # SQL that takes the numbering lock; None where the write transaction already holds it.
    numbering_lock: str | None

    def lock_numbering(self, conn: Connection) -> None:
        """Take the lock under which rounds and placement events are numbered."""
        if self.numbering_lock is not None:
            conn.exec_driver_sql(self.numbering_lock)

    def upsert(
        self,
        conn: Connection,
        table: Table,
        key: str,
        rows: Sequence[dict[str, Any]],
        *,
        stamp: tuple[str, tuple[str, ...]] | None = None,
    ) -> None:
        """Insert ``rows``, replacing those whose ``key`` is already stored.

        ``stamp`` (column, content columns): a replaced row takes the new value of that
        column only when one of the content columns differs from what it held (compared
        null-safely, before the row is changed); else it keeps its own.
        """
        conn.execute(_upsert(self.dialect, table, key, tuple(rows[0]), stamp), list(rows))


@functools.lru_cache(maxsize=32)
def _upsert(
    dialect: str,
    table: Table,
    key: str,
    columns: tuple[str, ...],
    stamp: tuple[str, tuple[str, ...]] | None = None,
) -> Any:
    # Built once per shape: node reports upsert a batch every few milliseconds, and
    # building the statement (and its cache key) was a fifth of what a batch cost.
    # The dialect is imported when first used: PostgreSQL's costs about 80 ms, which a
    # command on SQLite should not pay.
    stmt: Any
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as postgresql_insert

        stmt = postgresql_insert(table)
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        stmt = sqlite_insert(table)
    values: dict[str, Any] = {c: stmt.excluded[c] for c in columns if c != key}
    if stamp is not None:
        # SET expressions read the row as it was: the comparison sees the old content.
        column, content = stamp
        differs = or_(*(table.c[c].is_distinct_from(stmt.excluded[c]) for c in content))
        values[column] = case((differs, stmt.excluded[column]), else_=table.c[column])
    return stmt.on_conflict_do_update(index_elements=[table.c[key]], set_=values)


# One writer at a time by construction: a write transaction starts with BEGIN
# IMMEDIATE (events.database.connection), which already holds the only write lock there is.
SQLITE = Backend("sqlite", None)
# Several control-plane replicas may write at once. Rounds and placement events are
# numbered max + 1: two writers must not read the same max. Readers are not blocked
# (EXCLUSIVE, not ACCESS EXCLUSIVE).
POSTGRESQL = Backend("postgresql", "LOCK TABLE placement_rounds IN EXCLUSIVE MODE")


def backend(conn: Connection) -> Backend:
    """The back end of ``conn``'s database."""
    return POSTGRESQL if conn.dialect.name == "postgresql" else SQLITE
