"""SQLite text that is not UTF-8 is read as bytes, never a failed read.

SQLite stores whatever bytes it is handed as TEXT (``CAST(x'ff' AS TEXT)`` is
enough), and Python's driver raises while fetching such a value, for the whole
statement. One edited row would then stop every read that reaches it: `llmgw
models`, `history`, `verify`, start-up replay and the scheduler's reads alike,
which is exactly what the skip-and-name net exists to prevent.

Every SQLite connection of this project (events.database.connection) is a ``TolerantConnection``.
Its cursors fetch as the driver does (same C code, same speed) until a value
fails to decode. The cursor then runs its read again with a text factory that
gives such a value as ``bytes``, the value a BLOB in that column would give,
skips the rows it already handed out, and goes on from there. Every decoder
(events.core.rows for the log, scheduler.persistence.row_decoding for the scheduler's
tables) already
names a ``bytes`` value in a text column as the wrong type, so the row is skipped
and named at its position like any other unreadable row.

Only a read is run again: a statement that could write (anything but SELECT,
WITH and PRAGMA) raises as before, since running it twice would write twice. A
read run again in the same transaction sees the same rows in the same order
(SQLite's reads within a transaction are repeatable), so skipping the rows
already handed out is exact.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from typing import Any

_READS = ("SELECT", "WITH", "PRAGMA")


def _text_or_bytes(raw: bytes) -> str | bytes:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _undecodable(exc: sqlite3.OperationalError) -> bool:
    return str(exc).startswith("Could not decode to UTF-8")


class TolerantCursor(sqlite3.Cursor):
    """A cursor whose reads hand undecodable text over as bytes (see the module)."""

    _statement: tuple[str, Any] | None = None
    _delivered = 0
    # The rows of a read run again, not yet handed out (a deque: taken from the left).
    _rest: deque[Any] | None = None

    def execute(self, sql: str, parameters: Any = (), /) -> TolerantCursor:
        self._statement = (sql, parameters)
        self._delivered = 0
        self._rest = None
        super().execute(sql, parameters)
        return self

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> TolerantCursor:
        self._statement = None  # a write: never run again (see _recover)
        self._rest = None
        super().executemany(sql, seq_of_parameters)
        return self

    def fetchall(self) -> list[Any]:
        if self._rest is not None:
            rows = list(self._rest)
            self._rest.clear()
            return rows
        try:
            rows = super().fetchall()
        except sqlite3.OperationalError as exc:
            return self._recover(exc, None)
        self._delivered += len(rows)
        return rows

    def fetchmany(self, size: int | None = None) -> list[Any]:
        count = self.arraysize if size is None else size
        if self._rest is not None:
            rest = self._rest
            return [rest.popleft() for _ in range(min(count, len(rest)))]
        try:
            rows = super().fetchmany(count)
        except sqlite3.OperationalError as exc:
            return self._recover(exc, count)
        self._delivered += len(rows)
        return rows

    def fetchone(self) -> Any:
        if self._rest is not None:
            return self._rest.popleft() if self._rest else None
        try:
            row = super().fetchone()
        except sqlite3.OperationalError as exc:
            rows = self._recover(exc, 1)
            return rows[0] if rows else None
        if row is not None:
            self._delivered += 1
        return row

    def __iter__(self) -> TolerantCursor:
        return self

    def __next__(self) -> Any:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    def _recover(self, exc: sqlite3.OperationalError, count: int | None) -> list[Any]:
        statement = self._statement
        if (
            not _undecodable(exc)
            or statement is None
            or not statement[0].lstrip().upper().startswith(_READS)
        ):
            raise exc
        sql, parameters = statement
        connection = self.connection
        factory = connection.text_factory
        connection.text_factory = _text_or_bytes
        try:
            again = connection.cursor(sqlite3.Cursor)
            try:
                again.execute(sql, parameters)
                rest = again.fetchall()[self._delivered :]
            finally:
                again.close()
        finally:
            connection.text_factory = factory
        if count is None:
            self._rest = deque()
            return rest
        self._rest = deque(rest[count:])
        return rest[:count]


class TolerantConnection(sqlite3.Connection):
    """A connection whose cursors are ``TolerantCursor``s (``sqlite3.connect(factory=...)``)."""

    def cursor(self, factory: Any = TolerantCursor) -> Any:
        return super().cursor(factory)

    # The driver's shortcuts make a plain cursor of their own: route them through ours.
    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> Any:
        return self.cursor().executemany(sql, seq_of_parameters)
