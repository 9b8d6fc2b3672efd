"""The placements a round reads: every placement once, then only what changed (issue 42).

At 200,000 placements, reading and decoding every placement for every round cost seconds,
and between two rounds almost none change. Every transaction that writes placements (a
round's ``RoundStore.apply``, an agent's replica report) takes the next number of a change
sequence (``placement_rows.next_change``, migration 0023) under the numbering lock, held to
its commit, and stamps the rows it writes with it (``placements.change_seq``). So a reader
that sees the sequence at N knows every row stamped at most N has committed: no clock and
no margin. ``PlacementFeed`` reads the whole placements once (and every ``WHOLE_EVERY``),
then per round, by index:

- the rows stamped after the number it last saw (a row that can no longer be read is
  dropped, as a whole read skips it, and named by ``row_decoding``);
- how many rows there are: when that is not the count it knows, the keys, to find the
  placements deleted (a round's removals) and read any it does not know;
- the set of nodes whose agents report replica states (what each state's ``reported``
  reads) only when ``placement_changes.reporting`` moved (a node's first replica report,
  a node forgotten);
- the cordons, failures and running copies, which are small, whole.

It answers the same ``PlacementState`` as ``RoundStore.state`` (a hypothesis test holds
them equal over random writes, tests/integration/test_placement_changes.py), and the same
objects for the placements and the lifecycle when nothing in them changed, so that the
round compares nothing (``IncrementalRounds``).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, Engine, func, select

from scheduler.lifecycle.inputs import Lifecycle
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.persistence.lifecycle_store import (
    KEYS_PER_READ,
    read_cordons,
    read_failures,
    read_running_copies,
)
from scheduler.persistence.node_changes import WHOLE_EVERY
from scheduler.persistence.placement_rows import (
    StoredPlacement,
    changes_t,
    placements_t,
    read_placements,
    reporting_nodes,
)
from scheduler.persistence.round_store import PlacementState, round_head
from scheduler.planner.fleet.placements import Placement

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PlacementRead:
    """A round's placements: ``whole`` when read whole; ``changed``: whether the
    placements or the lifecycle differ from the last read's (the same objects if not)."""

    state: PlacementState
    whole: bool
    changed: bool


class PlacementFeed:
    """What changed in the placements since the last read, for one placer. Not
    thread-safe: one round at a time reads it (the daemon's rounds are serialised)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._rows: dict[Key, StoredPlacement] | None = None
        self._unreadable: set[Key] = set()
        self._seq = 0
        self._reporting_seq = 0
        self._reporting: frozenset[str] = frozenset()
        self._whole_at: datetime | None = None
        # The keys in order, each readable row's state, and what the last read answered.
        self._order: list[Key] = []
        self._statuses: dict[Key, ReplicaStatus] = {}
        self._placements: tuple[Placement, ...] = ()
        self._lifecycle = Lifecycle()

    def forget_all(self) -> None:
        """Read the whole placements next time."""
        self._rows = None

    def read(self, now: datetime) -> PlacementRead:
        """The placements and their lifecycle, read whole or patched with what changed."""
        with self.engine.connect() as conn:
            # The round first (as RoundStore.state): a round committed after it makes
            # the plan's write a conflict, never a plan passed on stale placements.
            round_id = round_head(conn)
            seq, reporting_seq = conn.execute(
                select(changes_t.c.seq, changes_t.c.reporting).where(changes_t.c.id == 1)
            ).one()
            whole_at, rows = self._whole_at, self._rows
            touched: set[Key] = set()
            whole = rows is None or whole_at is None or not whole_at <= now < whole_at + WHOLE_EVERY
            if whole or rows is None:
                rows = self._whole(conn)
                self._whole_at = now
                self._order = sorted(rows)
            else:
                touched = self._patch(conn, rows, int(seq))
            self._seq = int(seq)
            reporting_moved = False
            if whole or int(reporting_seq) != self._reporting_seq:
                reporting = reporting_nodes(conn)
                reporting_moved = reporting != self._reporting
                self._reporting = reporting
            self._reporting_seq = int(reporting_seq)
            cordons = read_cordons(conn)
            failures = read_failures(conn)
            running = read_running_copies(conn)
        self._rows = rows
        if touched:
            self._statuses = self._patched_statuses(rows, touched)
        if whole or reporting_moved:
            reporting = self._reporting
            self._statuses = {k: rows[k].status(reporting) for k in self._order}
        if whole or touched:
            self._placements = tuple(rows[k].placement for k in self._order)
        old = self._lifecycle
        changed = whole or bool(touched) or reporting_moved
        if changed or (cordons, failures, running) != (old.cordons, old.failures, old.running):
            changed = True
            self._lifecycle = Lifecycle(
                statuses=self._statuses, cordons=cordons, failures=failures, running=running
            )
        state = PlacementState(round_id, self._placements, self._lifecycle)
        return PlacementRead(state, whole, changed)

    def _patched_statuses(
        self, rows: dict[Key, StoredPlacement], touched: set[Key]
    ) -> dict[Key, ReplicaStatus]:
        """The keys' order and states with the touched keys' read again: a new dict (the
        one answered before is the round before's), in key order as a whole read's."""
        order, reporting = self._order, self._reporting
        statuses = dict(self._statuses)
        added = False
        for key in touched:
            r = rows.get(key)
            if r is None:
                if statuses.pop(key, None) is not None:
                    del order[bisect_left(order, key)]
            else:
                if key not in statuses:
                    insort(order, key)
                    added = True
                statuses[key] = r.status(reporting)
        return {k: statuses[k] for k in order} if added else statuses

    def _whole(self, conn: Connection) -> dict[Key, StoredPlacement]:
        rows = {(r.placement.model, r.placement.replica): r for r in read_placements(conn)}
        self._unreadable = _keys(conn) - rows.keys()
        return rows

    def _patch(self, conn: Connection, rows: dict[Key, StoredPlacement], seq: int) -> set[Key]:
        """Patch ``rows`` with what was written since; the keys read or dropped."""
        touched: set[Key] = set()
        if seq != self._seq:
            found = read_placements(conn, since=self._seq)
            written = _keys(conn, since=self._seq)
            for r in found:
                key = (r.placement.model, r.placement.replica)
                rows[key] = r
                touched.add(key)
            # Readable now (on PostgreSQL a row committed between a whole read's two
            # statements may have been taken for unreadable).
            self._unreadable -= touched
            gone = written - touched
            for key in gone:
                if rows.pop(key, None) is not None:
                    touched.add(key)
            self._unreadable |= gone
        count = conn.execute(select(func.count()).select_from(placements_t)).scalar_one()
        if count != len(rows) + len(self._unreadable):
            stored = _keys(conn)
            for key in rows.keys() - stored:
                del rows[key]
                touched.add(key)
            self._unreadable &= stored
            unknown = sorted(stored - rows.keys() - self._unreadable)
            for start in range(0, len(unknown), KEYS_PER_READ):
                for r in read_placements(conn, keys=unknown[start : start + KEYS_PER_READ]):
                    key = (r.placement.model, r.placement.replica)
                    rows[key] = r
                    touched.add(key)
            self._unreadable |= set(unknown) - rows.keys()
        return touched


def _keys(conn: Connection, since: int | None = None) -> set[Key]:
    query = select(placements_t.c.model, placements_t.c.replica)
    if since is not None:
        query = query.where(placements_t.c.change_seq > since)
    return {(str(m), int(r)) for m, r in conn.execute(query)}
