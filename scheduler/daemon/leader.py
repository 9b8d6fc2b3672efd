"""Only one scheduler acts on a database at a time.

On PostgreSQL several daemons may run (one per control-plane replica), and
leadership is a *leadership lease* (``scheduler.persistence.lease_store``): a
row naming the holder, an epoch and a deadline on the database's clock,
renewed every round. The leader stops acting the moment its own (monotonic)
clock says the lease may have lapsed: it counts the lease from *before* the
renewal was sent, so its deadline is never later than the database's. Another
replica takes the lease once the deadline has passed, under the next epoch, and
every write a round makes checks its epoch in its own transaction (the fence),
so a leader frozen by SIGSTOP, a long pause or a partition is replaced within
the lease and writes nothing when it wakes. The leader's connections carry TCP
keepalives and statement, lock and idle-in-transaction timeouts
(``events.database.connection.bounded_engine``): a frozen leader's open
transaction cannot hold the lease row, or the tables a round locks, for longer
than the lease either.

This replaced a session advisory lock, held on an idle connection that nobody
checked: a frozen leader kept it as long as the server kept its session (two
hours with PostgreSQL's default ``tcp_keepalives_idle``), and nothing fenced
its late writes.

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
``SchedulerStore.apply``). On SQLite that fence is the round's own (a round is
written only on the round it was planned from); on PostgreSQL the lease's epoch
is checked as well.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Protocol

import structlog
from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from events.database.connection import bounded_engine, sqlite_path
from scheduler.daemon.lease_terms import MIN_LEASE_S, lease_seconds
from scheduler.persistence.lease_store import Fence, Lease, claim, give_up

__all__ = ["MIN_LEASE_S", "Leadership", "LeaseLeadership", "leadership_for", "lease_seconds"]

log = structlog.get_logger("llmgw.scheduler")


class Leadership(Protocol):
    def ensure(self) -> bool:
        """Whether this process leads now (trying to become leader if it does not)."""

    def holds(self) -> bool:
        """Whether this process may still act as leader, by its own clock."""

    def fence(self) -> Fence | None:
        """The check a leader's writes make in their transaction; None: none needed."""

    def release(self) -> None: ...


def default_holder() -> str:
    """A holder name that is this process's alone (a restarted replica is a new holder)."""
    return f"{socket.gethostname()} pid {os.getpid()} {secrets.token_hex(3)}"


class LeaseLeadership:
    """Leadership as a leadership lease in the database (PostgreSQL; see the module)."""

    def __init__(
        self,
        engine: Engine,
        lease_s: float,
        holder: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.lease_s = lease_s
        # Shown by `llmgw status`; `llmgw serve` adds its URL once it listens.
        self.holder = holder or default_holder()
        self._clock = clock
        self._epoch: int | None = None
        self._deadline = 0.0
        # The lease as this process last saw it (its own or another's).
        self.lease: Lease | None = None

    @property
    def epoch(self) -> int | None:
        return self._epoch

    def ensure(self) -> bool:
        sent = self._clock()
        try:
            with self.engine.begin() as conn:
                leading, lease = claim(
                    conn, self.holder, self._epoch, timedelta(seconds=self.lease_s)
                )
        except DBAPIError:
            # Renewed or not, nobody knows: the deadline already counted stands.
            raise
        self.lease = lease
        if leading and lease is not None:
            if lease.epoch != self._epoch:
                log.info(
                    "leadership.lease_acquired",
                    holder=self.holder,
                    epoch=lease.epoch,
                    expires_at=lease.expires_at.isoformat(),
                )
            self._epoch = lease.epoch
            self._deadline = sent + self.lease_s
        else:
            if self._epoch is not None:
                log.warning(
                    "leadership.lease_lost",
                    holder=self.holder,
                    epoch=self._epoch,
                    now_held_by=None if lease is None else lease.holder,
                    now_epoch=None if lease is None else lease.epoch,
                )
            self._epoch = None
        return self.holds()

    def holds(self) -> bool:
        return self._epoch is not None and self._clock() < self._deadline

    def fence(self) -> Fence | None:
        if self._epoch is None:
            # Never None for a leader: a fence no lease can pass refuses every write.
            return Fence(self.holder, 0)
        return Fence(self.holder, self._epoch)

    def release(self) -> None:
        """Give the lease up now, so another replica takes over at its next round."""
        if self._epoch is not None:
            try:
                with self.engine.begin() as conn:
                    give_up(conn, self.holder, self._epoch)
                log.info("leadership.lease_released", holder=self.holder, epoch=self._epoch)
            except DBAPIError as exc:
                log.warning(
                    "leadership.lease_release_failed",
                    holder=self.holder,
                    error=str(exc.orig or exc).strip().splitlines()[0],
                )
        self._epoch = None
        self._deadline = 0.0


class FileLeadership:
    """Leadership as an exclusive ``flock`` on the SQLite database file (see above)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None
        self._held = False

    def holds(self) -> bool:
        return self._held

    def fence(self) -> Fence | None:
        return None  # the kernel holds the flock until this process dies

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

    def holds(self) -> bool:
        return True

    def fence(self) -> Fence | None:
        return None

    def release(self) -> None:
        pass


def leadership_for(
    url: str, lease_s: float, *, engine: Engine | None = None, holder: str | None = None
) -> Leadership:
    """The leadership for ``url``: a leadership lease of ``lease_s`` on PostgreSQL (on
    ``engine``, the scheduler's, when given), a flock on a SQLite file."""
    if make_url(url).get_backend_name() != "sqlite":
        return LeaseLeadership(engine or bounded_engine(url, lease_s), lease_s, holder)
    path = sqlite_path(url)
    if path is None:
        return ProcessLeadership()
    return FileLeadership(path)
