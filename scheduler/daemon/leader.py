"""Only one scheduler acts on a database at a time.

On PostgreSQL several daemons may run (one per control-plane replica): each
tries a session-level advisory lock on a dedicated connection, the holder
leads, and the others wait. When the leader dies its session ends, the lock is
released, and the next daemon to try takes over. Leadership is checked every
round, because a connection can die without the process noticing.

On SQLite, where every process is on one machine, an exclusive ``flock`` on
the database file itself does the same; the kernel releases it when the
holder dies. Not on a file beside it: anyone tidying the directory could
delete such a file under a running leader, and the next daemon would create a
new one, lock it and lead too. The database file cannot be deleted or
replaced without losing the database. SQLite locks the file with POSIX
(``fcntl``) locks, which on Linux are independent of ``flock``, so the two do
not interfere. One thing must hold: POSIX locks are dropped when the process
closes *any* descriptor of the file, so the descriptor is opened once and
kept until the daemon stops, never opened and closed per round.

Leading is necessary but not sufficient for writing: a paused leader may wake
after it lost the lock, so the write itself is fenced too (see
``SchedulerStore.apply``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Protocol

from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from events.database.connection import make_engine, sqlite_path

# pg advisory locks are keyed by a bigint; this one is "llmgw-scheduler".
ADVISORY_KEY = 0x6C6C6D6777_5343


class Leadership(Protocol):
    def ensure(self) -> bool:
        """Whether this process leads now (trying to become leader if it does not)."""

    def release(self) -> None: ...


class PostgresLeadership:
    def __init__(self, url: str) -> None:
        # A dedicated connection outside any pool: the lock lives as long as it does.
        self._engine: Engine = make_engine(url, poolclass=NullPool)
        self._conn: Connection | None = None
        self._held = False

    def ensure(self) -> bool:
        try:
            if self._conn is None:
                self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                self._held = False
            if self._held:
                # Still the same session? If it died, the lock went with it.
                still = self._conn.execute(
                    text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND pid = pg_backend_pid() AND granted"
                    )
                ).scalar_one()
                self._held = bool(still)
            if not self._held:
                self._held = bool(
                    self._conn.execute(
                        text("SELECT pg_try_advisory_lock(:key)"), {"key": ADVISORY_KEY}
                    ).scalar_one()
                )
        except DBAPIError:
            self._drop()
            raise
        return self._held

    def _drop(self) -> None:
        self._held = False
        if self._conn is not None:
            with contextlib.suppress(DBAPIError):
                self._conn.invalidate()
                self._conn.close()
            self._conn = None

    def release(self) -> None:
        if self._conn is not None and self._held:
            with contextlib.suppress(DBAPIError):
                self._conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": ADVISORY_KEY})
        self._drop()
        self._engine.dispose()


class FileLeadership:
    """Leadership as an exclusive ``flock`` on the SQLite database file (see above)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None
        self._held = False

    def ensure(self) -> bool:
        if self._held:
            return True
        if self._fd is None:
            # Never created or truncated here: this is the database.
            self._fd = os.open(self._path, os.O_RDONLY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self._held = True
        return True

    def release(self) -> None:
        if self._fd is not None:
            if self._held:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
            self._held = False


class ProcessLeadership:
    """An in-memory SQLite database is private to its process: that process leads."""

    def ensure(self) -> bool:
        return True

    def release(self) -> None:
        pass


def leadership_for(url: str) -> Leadership:
    if make_url(url).get_backend_name() != "sqlite":
        return PostgresLeadership(url)
    path = sqlite_path(url)
    if path is None:
        return ProcessLeadership()
    return FileLeadership(path)
