"""What differs between the scheduler's back ends, chosen once per connection.

Everything else the scheduler stores is the same SQL on SQLite and
PostgreSQL; the differences live in one module per back end
(``backend_sqlite``, ``backend_postgresql``) behind this protocol, so no
other module asks which database it talks to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy import Connection, Table


class Backend(Protocol):
    def lock_numbering(self, conn: Connection) -> None:
        """Take the lock under which rounds and placement events are numbered."""

    def upsert(
        self, conn: Connection, table: Table, key: str, rows: Sequence[dict[str, Any]]
    ) -> None:
        """Insert ``rows``, replacing those whose ``key`` is already stored."""


def backend(conn: Connection) -> Backend:
    if conn.dialect.name == "postgresql":
        from scheduler.persistence.backend_postgresql import POSTGRESQL

        return POSTGRESQL
    from scheduler.persistence.backend_sqlite import SQLITE

    return SQLITE
