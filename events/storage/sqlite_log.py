"""The event log on SQLite: one writer at a time, by the database's own lock.

A write section starts with ``BEGIN IMMEDIATE``: the write lock is taken
before the head is read, so the next writer cannot read the head until this
one has committed, and two writers queue (up to the busy timeout, events.database.connection)
instead of deadlocking on a deferred transaction's lock upgrade. Readers never
block the writer (WAL mode).

The section runs on the driver's own connection, its transaction begun and
ended here: the connection's settings (events.database.connection) leave transactions to
explicit statements. A command is a handful of statements around a commit, and
SQLAlchemy's ``Connection``, transaction and ``begin`` event around them were a
large part of its CPU (BENCHMARKS.md, "Validated adds"); so was taking a
connection from the pool and giving it back, so the log keeps one connection
for its writes (``_writer``), taken from the engine's pool once (with the
engine's settings) and detached from it. A second thread of the process that
wants to write while the first does takes a pooled connection as before and
waits on the database's lock like any other writer.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from sqlalchemy import Engine

from events.storage.sql_log import SqlLockedLog, SqlLog, driver_error


class SqliteLog(SqlLog):
    """The log in a SQLite file."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._writer_lock = threading.Lock()
        # (process id, the connection): a connection is never used across a fork.
        self._writer: tuple[int, Any] | None = None

    @contextmanager
    def writing(self) -> Iterator[SqlLockedLog]:
        if not self._writer_lock.acquire(blocking=False):
            # Another thread of this process is writing: queue on the database's
            # lock (its busy timeout) from a pooled connection, as any writer does.
            with self.driver() as conn:
                yield from self._section(conn)
            return
        try:
            conn = self._held()
            try:
                yield from self._section(conn)
            except self.engine.dialect.loaded_dbapi.Error as exc:
                gone = self.engine.dialect.is_disconnect(exc, conn, None)
                if gone:  # never reused; the next section opens another
                    self._writer = None
                    _close_quietly(conn)
                raise driver_error(self.engine.dialect, exc, gone) from exc
        finally:
            self._writer_lock.release()

    def _section(self, conn: Any) -> Iterator[SqlLockedLog]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield SqlLockedLog(conn, self.engine.dialect)
        except BaseException:
            conn.rollback()
            raise
        conn.commit()

    def _held(self) -> Any:
        """The log's own write connection (hold ``_writer_lock``)."""
        held = self._writer
        pid = os.getpid()
        if held is not None and held[0] == pid:
            return held[1]
        # The first write of this process (a connection inherited through a fork
        # is left alone: the parent may still be using it).
        raw = self.engine.raw_connection()
        try:
            raw.detach()  # closed with the log, not returned to the pool
            conn = raw.dbapi_connection
        except BaseException:
            raw.invalidate()
            raise
        self._writer = (pid, conn)
        return conn


def _close_quietly(conn: Any) -> None:
    with suppress(Exception):  # a connection already dead may refuse to close
        conn.close()
