"""The nodes a round reads: every node once, then only what changed since (issue 42).

At 100,000 nodes, reading every node for every round costs more than the round
(heartbeats renew each node's lease every few seconds; its content almost never
changes). ``NodeFeed`` reads the whole inventory once, then per round, each through an
index (migration 0021):

- the nodes whose content changed since its last read (``changed_at``, set by a report
  only when the content differs; ``inventory_store.write_reports``), less ``MARGIN``: a
  report stamped just before that read may commit after it, and a writer's clock may be a
  little behind the reader's. Re-reading a node whose content did not change is harmless
  (the round compares content), so a round reads the nodes changed in its interval and
  the margin; and the whole inventory every ``WHOLE_EVERY``, whatever it missed;
- the nodes not fresh (``reported_at`` before ``now - stale_after``), with their lease
  times: every other node is fresh, whatever its lease says exactly;
- how many nodes there are: when that is not the count it knows, the names, to find the
  nodes forgotten (and read any it does not know).

What it returns is ``scheduler.planner.rounds.incremental.Changes``' node part. A row
that cannot be read is skipped and named, as everywhere (``row_decoding``), and counted
so that it does not make every round read the names again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Select, func, select

from scheduler.persistence.inventory_store import node_from_row, nodes_t
from scheduler.persistence.row_decoding import Row, decode_rows, raw
from scheduler.planner.fleet.inventory import Node

# How far before its last read a round looks again: a report stamped before that read
# may commit after it, and one writer's clock may run behind the reader's.
MARGIN = timedelta(seconds=30)
# How often the whole inventory is read anyway: a change missed (a writer's clock more
# than MARGIN behind, a row changed by hand) is seen within this, as the kubelet sends
# its whole status every few minutes whatever its heartbeats say.
WHOLE_EVERY = timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class NodeChanges:
    """The nodes of a round: all of them (``whole``), or those changed since the last."""

    whole: bool
    nodes: Sequence[Node] = ()
    forgotten: frozenset[str] = frozenset()
    # Every node not fresh at the round's time, with its lease time.
    not_fresh: Mapping[str, datetime] = field(default_factory=dict)


class NodeFeed:
    """What changed in the inventory since the last read, for one placer. Not thread-safe:
    one round at a time reads it (the daemon's rounds are serialised)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._names: set[str] | None = None
        self._unreadable: set[str] = set()
        # The time of the last read, and of the last whole one (the round's ``now``).
        self._last: datetime | None = None
        self._whole_at: datetime | None = None

    def forget_all(self) -> None:
        """Read the whole inventory next time."""
        self._names = None

    def read(self, now: datetime, stale_after: timedelta) -> NodeChanges:
        """The nodes changed since the last read (or all of them: the first read, one
        ``WHOLE_EVERY`` after the last whole one, or the clock gone back)."""
        fresh_from = now - stale_after
        last, whole_at = self._last, self._whole_at
        with self.engine.connect() as conn:
            if (
                self._names is None
                or last is None
                or whole_at is None
                or now < last
                or now - whole_at >= WHOLE_EVERY
            ):
                return self._whole(conn, now, fresh_from)
            query = raw(nodes_t).where(nodes_t.c.changed_at >= last - MARGIN)
            changed = _read(conn, query)
            names = self._names
            names.update(n.name for n in changed)
            # Readable now: on PostgreSQL a node committed between a whole read's two
            # statements is among the names but not the rows, and taken for unreadable;
            # left there, every round's count would miss by one and read every name.
            self._unreadable.difference_update(n.name for n in changed)
            forgotten: frozenset[str] = frozenset()
            count = conn.execute(select(func.count()).select_from(nodes_t)).scalar_one()
            if count != len(names) + len(self._unreadable):
                stored = set(conn.execute(select(nodes_t.c.name)).scalars())
                forgotten = frozenset(names - stored)
                names -= forgotten
                self._unreadable &= stored
                unknown = stored - names - self._unreadable
                if unknown:
                    found = _read(conn, raw(nodes_t).where(nodes_t.c.name.in_(sorted(unknown))))
                    changed = [*changed, *found]
                    names.update(n.name for n in found)
                    self._unreadable |= unknown - names
            not_fresh = _not_fresh(conn, fresh_from)
        self._last = now
        return NodeChanges(False, changed, forgotten, not_fresh)

    def _whole(self, conn: Connection, now: datetime, fresh_from: datetime) -> NodeChanges:
        nodes = _read(conn, raw(nodes_t).order_by(nodes_t.c.name))
        stored = set(conn.execute(select(nodes_t.c.name)).scalars())
        self._names = {n.name for n in nodes}
        self._unreadable = stored - self._names
        self._last = self._whole_at = now
        return NodeChanges(True, nodes, frozenset(), _not_fresh(conn, fresh_from))


def _read(conn: Connection, query: Select[Any]) -> list[Node]:
    return decode_rows(
        conn, query, table="nodes", key=("name",), decode=node_from_row, times=("reported_at",)
    )


def _lease(r: Row) -> tuple[str, datetime]:
    return r["name"], r["reported_at"]


def _not_fresh(conn: Connection, fresh_from: datetime) -> dict[str, datetime]:
    """The nodes whose lease is older than ``fresh_from`` (by its index), with it."""
    query = raw(nodes_t, "name", "reported_at").where(nodes_t.c.reported_at < fresh_from)
    return dict(
        decode_rows(
            conn, query, table="nodes", key=("name",), decode=_lease, times=("reported_at",)
        )
    )
