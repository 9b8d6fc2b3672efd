"""The event log on SQLite: one writer at a time, by the database's own lock.

A write section starts with ``BEGIN IMMEDIATE``: the write lock is taken
before the head is read, so the next writer cannot read the head until this
one has committed, and two writers queue (up to the busy timeout, events.db)
instead of deadlocking on a deferred transaction's lock upgrade. Readers never
block the writer (WAL mode).

The section runs on the driver's own connection from the engine's pool
(``SqlLog.driver``), its transaction begun and ended here: the connection's
settings (events.db) leave transactions to explicit statements. A command is
a handful of statements around a commit, and SQLAlchemy's ``Connection``,
transaction and ``begin`` event around them were a large part of its CPU
(BENCHMARKS.md, "Validated adds").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from events.store import SqlLockedLog, SqlLog


class SqliteLog(SqlLog):
    """The log in a SQLite file."""

    @contextmanager
    def writing(self) -> Iterator[SqlLockedLog]:
        with self.driver() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield SqlLockedLog(conn, self.engine.dialect)
            except BaseException:
                conn.rollback()
                raise
            conn.commit()
