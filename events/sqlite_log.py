"""The event log on SQLite: one writer at a time, by the database's own lock.

A write transaction starts with ``BEGIN IMMEDIATE`` (the engine's settings,
events.db, do it for every connection opened with the ``WRITE`` option, which
``SqlLog.writing`` sets): the write lock is taken before the head is read, so
the next writer cannot read the head until this one has committed, and two
writers queue (up to the busy timeout) instead of deadlocking on a deferred
transaction's lock upgrade. Readers never block the writer (WAL mode).
"""

from __future__ import annotations

from sqlalchemy import Connection

from events.store import SqlLog


class SqliteLog(SqlLog):
    """The log in a SQLite file."""

    def _lock(self, conn: Connection) -> None:
        # Already held: BEGIN IMMEDIATE took it when the transaction began.
        return None
