"""The leadership lease: one row per role, claimed, renewed and checked in SQL.

A leader holds the lease until ``expires_at``, a time on the *database's* clock
(``clock_timestamp()``), so replicas whose clocks disagree agree on when it
lapsed. It renews the lease every round; any other replica may take it once it
has lapsed, and taking it adds one to ``epoch``. A write the leader makes is
*fenced*: in the write's own transaction, ``Fence`` reads the lease row ``FOR
SHARE`` and refuses (``LeadershipLost``) unless the row still names this holder
and epoch and has not lapsed. The share lock keeps a takeover waiting until the
write commits, so a write is either made under a lease that held throughout or
not made at all: a leader that wakes from SIGSTOP after another took over
writes nothing.

PostgreSQL only: on SQLite every process is on one machine and leadership is a
``flock`` (``scheduler.daemon.leader``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Interval,
    Row,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from scheduler.persistence.tables import LeadershipLeaseRow, table

lease_t = table(LeadershipLeaseRow)

# The placement scheduler's lease (the only role so far; the name leaves room for others).
SCHEDULER = "scheduler"


class LeadershipLost(Exception):
    """The write's leadership lease is no longer current; nothing was written."""


@dataclass(frozen=True, slots=True)
class Lease:
    holder: str
    epoch: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    # Whether it had lapsed when read, by the database's clock.
    lapsed: bool

    def to_json(self) -> dict[str, object]:
        return {
            "holder": self.holder,
            "epoch": self.epoch,
            "acquired_at": self.acquired_at.isoformat(),
            "renewed_at": self.renewed_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "lapsed": self.lapsed,
        }


@dataclass(frozen=True, slots=True)
class Fence:
    """A check, made inside a write's transaction, that ``holder`` still leads in ``epoch``."""

    holder: str
    epoch: int
    name: str = SCHEDULER

    def __call__(self, conn: Connection) -> None:
        held = conn.execute(
            select(lease_t.c.epoch)
            .where(
                lease_t.c.name == self.name,
                lease_t.c.holder == self.holder,
                lease_t.c.epoch == self.epoch,
                lease_t.c.expires_at > func.clock_timestamp(),
            )
            .with_for_update(read=True)
        ).first()
        if held is None:
            current = read_lease(conn, self.name)
            now = (
                "no lease"
                if current is None
                else f"epoch {current.epoch} held by {current.holder}"
                + (" (lapsed)" if current.lapsed else "")
            )
            raise LeadershipLost(
                f"the leadership lease of epoch {self.epoch} ({self.holder}) is not current: {now}"
            )


def _columns() -> tuple[ColumnElement[Any], ...]:
    c = lease_t.c
    lapsed = (c.expires_at <= func.clock_timestamp()).label("lapsed")
    return (c.holder, c.epoch, c.acquired_at, c.renewed_at, c.expires_at, lapsed)


def _lease(row: Row[Any]) -> Lease:
    return Lease(
        holder=row.holder,
        epoch=int(row.epoch),
        acquired_at=row.acquired_at,
        renewed_at=row.renewed_at,
        expires_at=row.expires_at,
        lapsed=bool(row.lapsed),
    )


def read_lease(conn: Connection, name: str = SCHEDULER) -> Lease | None:
    row = conn.execute(select(*_columns()).where(lease_t.c.name == name)).first()
    return None if row is None else _lease(row)


def claim(
    conn: Connection,
    holder: str,
    held_epoch: int | None,
    duration: timedelta,
    name: str = SCHEDULER,
) -> tuple[bool, Lease | None]:
    """Renew ``holder``'s lease of ``held_epoch``, or take a lapsed or absent one.

    Call inside a transaction. Returns whether ``holder`` leads afterwards, and the
    lease as it then stands (the other holder's, when not).
    """
    now = func.clock_timestamp()
    until = now + literal(duration, Interval())
    current = conn.execute(
        select(*_columns()).where(lease_t.c.name == name).with_for_update()
    ).first()
    if current is None:
        try:
            with conn.begin_nested():
                conn.execute(
                    insert(lease_t).values(
                        name=name,
                        holder=holder,
                        epoch=1,
                        acquired_at=now,
                        renewed_at=now,
                        expires_at=until,
                    )
                )
        except IntegrityError:  # another replica inserted it first
            return False, read_lease(conn, name)
        return True, read_lease(conn, name)
    lease = _lease(current)
    if lease.holder == holder and lease.epoch == held_epoch and not lease.lapsed:
        conn.execute(
            update(lease_t).where(lease_t.c.name == name).values(renewed_at=now, expires_at=until)
        )
    elif lease.lapsed:
        conn.execute(
            update(lease_t)
            .where(lease_t.c.name == name)
            .values(
                holder=holder,
                epoch=lease.epoch + 1,
                acquired_at=now,
                renewed_at=now,
                expires_at=until,
            )
        )
    else:
        return False, lease
    return True, read_lease(conn, name)


def give_up(conn: Connection, holder: str, epoch: int, name: str = SCHEDULER) -> None:
    """End ``holder``'s lease now (a clean stop), so another replica takes over at once."""
    conn.execute(
        update(lease_t)
        .where(lease_t.c.name == name, lease_t.c.holder == holder, lease_t.c.epoch == epoch)
        .values(expires_at=func.clock_timestamp())
    )
