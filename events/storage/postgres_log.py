"""The event log on PostgreSQL, shared by several control-plane replicas.

A writer takes ``LOCK TABLE events IN EXCLUSIVE MODE`` inside its transaction:
writers queue, readers still read. Because the next writer cannot read the
head until the previous one has committed, position N+1 never becomes visible
before N. The lock is waited for at most ``PG_LOCK_TIMEOUT``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from events.storage.sql_log import SqlLockedLog, SqlLog

# How long a writer waits for the log's lock before giving up with an error:
# long enough for any queue of writers, short enough to not hang forever.
PG_LOCK_TIMEOUT = "30s"


class PostgresLog(SqlLog):
    """The log in a PostgreSQL database."""

    @contextmanager
    def writing(self) -> Iterator[SqlLockedLog]:
        # The transaction stays SQLAlchemy's here (a network round trip dwarfs its
        # cost); the section's statements run on its driver connection.
        with self.engine.connect() as conn, conn.begin():
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{PG_LOCK_TIMEOUT}'")
            conn.exec_driver_sql("LOCK TABLE events IN EXCLUSIVE MODE")
            yield SqlLockedLog(conn.connection.dbapi_connection, conn.dialect)
