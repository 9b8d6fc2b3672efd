"""Placements and fenced rounds: the state a plan starts from, and writing a plan.

Applying a plan is one transaction, fenced like the catalog's log: a round is
planned from the placements as of round N and is written only if no other
round was written since. Two daemons that both believe they lead (a network
partition, a paused process) therefore cannot both apply plans made from the
same state; the loser's round is refused and it plans again from what is
there. Rounds are numbered gaplessly under the write lock, and so are
placement events, for the same reason as the catalog's positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter
from types import MappingProxyType

from sqlalchemy import Connection, Engine, delete, func, insert, select, update

from events.database.connection import WRITE
from scheduler.lifecycle.inputs import Cordon, Lifecycle
from scheduler.lifecycle.replica_reports import PLACED as PLACED_STATE
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.audit_trail import (
    PLACED,
    REMOVED,
    REPLICA_FAILED,
    UPDATED,
    Move,
    TrailEntry,
    append_trail,
    lock_trail,
    moves_between,
)
from scheduler.persistence.lease_store import Fence
from scheduler.persistence.lifecycle_store import (
    read_cordons,
    read_failures,
    read_running_copies,
    read_statuses,
    record_failures,
    set_cordon,
)
from scheduler.persistence.placement_rows import (
    next_change,
    placement_row,
    read_placements,
    reporting_nodes,
)
from scheduler.persistence.recorded_rounds import record_round
from scheduler.persistence.round_chain import ChainHead
from scheduler.persistence.tables import PlacementRoundRow, PlacementRow, table
from scheduler.persistence.versions import record_definitions
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Placement, Plan, not_among

placements_t = table(PlacementRow)
rounds_t = table(PlacementRoundRow)


class RoundConflict(Exception):
    """Another round was written since this one read the placements; nothing was written."""


@dataclass(frozen=True, slots=True)
class PlacementState:
    """The placements as of a round: what a plan starts from."""

    round_id: int
    placements: tuple[Placement, ...]
    # Replica states, cordons and failures, read with the placements.
    lifecycle: Lifecycle = field(default_factory=Lifecycle)

    def replicas(
        self, *, node: str | None = None, model: str | None = None
    ) -> list[tuple[Placement, ReplicaStatus]]:
        """Each placement with its state, optionally only those on ``node`` or of ``model``."""
        return [
            (p, self.lifecycle.statuses.get((p.model, p.replica)) or _unknown_status())
            for p in self.placements
            if (node is None or node in p.nodes) and (model is None or p.model == model)
        ]


def read_service(conn: Connection) -> tuple[dict[str, Cordon], dict[str, int]]:
    """``RoundStore.service`` on a connection the caller holds."""
    return read_cordons(conn), _count_hosted(conn)


def _count_hosted(conn: Connection) -> dict[str, int]:
    hosted: dict[str, int] = {}
    for row in read_placements(conn):
        for name in row.placement.nodes:
            hosted[name] = hosted.get(name, 0) + 1
    return hosted


# Past this many rounds since the counts were kept, reading every placement is no dearer.
CATCH_UP_ROUNDS = 20


def _moved(counts: Mapping[str, int], moves: list[Move] | None) -> dict[str, int] | None:
    """``counts`` after ``moves`` (None when the moves could not all be read)."""
    if moves is None:
        return None
    hosted = dict(counts)
    for move in moves:
        step = 1 if move.type == PLACED else -1
        for name in move.nodes:
            left = hosted.get(name, 0) + step
            if left < 0:
                return None  # not what the counts said: read them whole
            if left:
                hosted[name] = left
            else:
                hosted.pop(name, None)
    return hosted


class HostedCounts:
    """How many replicas each node hosts, kept between batches and moved by each round's trail.

    Each batch of node reports is answered with its nodes' replica counts; read
    from every placement, that cost grew with the cluster (10,000 placements
    for a batch of a few dozen reports). Only a round changes which nodes the
    placements run on: ``RoundStore.apply`` inserts and deletes them in the
    transaction that records the round, whose id is one more than the last
    (taken under the trail lock, so ids commit in order). Replica reports
    change a placement's state, never its nodes. So the newest round's id,
    read in the caller's transaction (an index lookup), says whether the counts
    read before still hold. No staleness on SQLite (the batch's transaction is
    a write, serialised with rounds); on PostgreSQL (read committed) a round
    that commits after that lookup is not seen, as it was not seen when every
    batch read all placements. Rows changed by hand outside a round (an
    operator's SQL) are not seen until the counts are next read whole.

    After a round, the counts are moved by the rounds' placed and removed events
    (``trail.moves_between``): each insert or delete of a placement by a round is one,
    in the same transaction. They are read whole again by a process's first batch,
    after more than ``CATCH_UP_ROUNDS`` rounds, or when one of those events cannot be
    read or would take a count below zero.
    """

    def __init__(self) -> None:
        # (round id, counts as of it); replaced whole, never changed, so the
        # writer thread and any other reader can share it without a lock.
        self._known: tuple[int, Mapping[str, int]] | None = None

    def read(self, conn: Connection) -> Mapping[str, int]:
        head = _round_head(conn)
        known = self._known
        if known is not None and known[0] == head:
            return known[1]
        hosted = None
        if known is not None and head - known[0] <= CATCH_UP_ROUNDS:
            # The rounds since moved only what their trail says (every placement a round
            # inserts or deletes is a placed or removed event of that round, in its
            # transaction): apply those to the counts rather than reading every
            # placement, which cost the first batch after each round ~190 ms at 11,000.
            hosted = _moved(known[1], moves_between(conn, after_round=known[0], through_round=head))
        if hosted is None:
            hosted = _count_hosted(conn)
        # On PostgreSQL each statement sees what was committed when it began: a
        # round committed between the two lookups may or may not be in ``hosted``,
        # so such counts answer this batch but are not kept under either id.
        if _round_head(conn) == head:
            self._known = (head, MappingProxyType(hosted))
        return hosted


def round_head(conn: Connection) -> int:
    """The last round's id (0 before any): what a plan's write is fenced on."""
    return _round_head(conn)


class RoundStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # The last round this store recorded, as ``record_round`` keeps it: the next
        # round, if it is that one's successor, is recorded as its changes since
        # (``scheduler.persistence.round_chain``). Replaced whole after a commit.
        self._chain: ChainHead | None = None

    def state(self) -> PlacementState:
        """The current placements and the round they are as of.

        The round is read first: if a round commits between the two reads, the
        placements are newer than the round number, and applying a plan then
        fails safe (a conflict) rather than passing on stale placements.
        """
        with self.engine.connect() as conn:
            round_id = _round_head(conn)
            rows = read_placements(conn)
            lifecycle = Lifecycle(
                statuses=read_statuses(conn, rows),
                cordons=read_cordons(conn),
                failures=read_failures(conn),
                running=read_running_copies(conn),
            )
        return PlacementState(round_id, tuple(r.placement for r in rows), lifecycle)

    def replicas(
        self, *, node: str | None = None, model: str | None = None
    ) -> list[tuple[Placement, ReplicaStatus]]:
        """Every placement with its state, optionally only those on ``node`` or of ``model``.

        With ``node`` (an agent's read of its placements), only that node's rows and the
        reporting flags of their nodes are read: the whole state, read and then filtered,
        cost 3.9 s of CPU at 110,000 placements, for each agent's read."""
        if node is None:
            return self.state().replicas(model=model)
        with self.engine.connect() as conn:
            rows = read_placements(conn, node=node)
            among = sorted({n for r in rows for n in r.placement.nodes})
            reporting = reporting_nodes(conn, among) if among else frozenset()
        return [
            (r.placement, r.status(reporting))
            for r in rows
            if model is None or r.placement.model == model
        ]

    def service(self) -> tuple[dict[str, Cordon], dict[str, int]]:
        """The cordons by node, and how many replicas each node hosts: what `nodes list` shows."""
        with self.engine.connect() as conn:
            return read_service(conn)

    def cordon(self, node: str, mode: str | None, *, actor: str, reason: str) -> Cordon | None:
        """Cordon, drain or (``mode`` None) uncordon a node; returns how it was before."""
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            return set_cordon(conn, node, mode, actor=actor, reason=reason, now=datetime.now(UTC))

    def apply(
        self,
        plan: Plan,
        *,
        based_on: PlacementState,
        catalog_position: int,
        nodes: Sequence[Node],
        now: datetime,
        policy: StalenessPolicy,
        definitions: Mapping[tuple[str, str], str] | None = None,
        fence: Fence | None = None,
    ) -> int | None:
        """Write a plan's changes and its audit trail in one transaction.

        ``fence``: the leader's leadership lease, checked first in the transaction
        (``LeadershipLost`` if it is no longer current) and recorded with the round.

        ``definitions``: (model, version) -> definition JSON of the versions the
        plan's placements are pinned to (``scheduler.persistence.versions``), recorded in the
        same transaction, so that no agent is ever sent a version it cannot read.

        Returns the new round's id, or None when the plan changes nothing (such
        a round is not recorded). Raises ``RoundConflict`` if another round was
        written since ``based_on`` was read.
        """
        # Identity first: a kept placement is, nearly always, the very object read (a
        # dataclass compares field by field even with itself: 0.1 s at 170,000), and with
        # nothing placed and every kept placement read, no index of them all is needed.
        others = not_among(plan.keep, based_on.placements)
        held = based_on.placements
        before = dict(zip(map(_slot, held), held, strict=True)) if others or plan.place else {}
        updated = [p for p in others if before.get(_slot(p)) != p]
        if not (plan.place or plan.remove or updated):
            return None
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            if fence is not None:
                fence(conn)
            lock_trail(conn)
            head = _round_head(conn)
            if head != based_on.round_id:
                raise RoundConflict(
                    f"round {head} was written since this plan read round {based_on.round_id}"
                )
            round_id = head + 1
            seq = next_change(conn)
            chain = record_round(
                conn,
                round_id=round_id,
                now=now,
                catalog_position=catalog_position,
                nodes=nodes,
                current=based_on.placements,
                policy=policy,
                lifecycle=based_on.lifecycle,
                counts=(len(plan.place), len(plan.remove), len(plan.unplaced)),
                leader=None if fence is None else (fence.holder, fence.epoch),
                chain=self._chain,
            )
            for removal in plan.remove:
                p = removal.placement
                conn.execute(
                    delete(placements_t).where(
                        placements_t.c.model == p.model, placements_t.c.replica == p.replica
                    )
                )
            record_definitions(conn, definitions or {}, now)
            unreadable = _clear_unreadable(conn, plan.place, before)
            if plan.place:
                conn.execute(
                    insert(placements_t),
                    [placement_row(p, round_id, now, seq) for p in plan.place],
                )
            for copy in plan.again:
                # Placed again where it runs: it starts as its engine last reported, not
                # as "placed" (its agent may not report again until something changes).
                conn.execute(
                    update(placements_t)
                    .where(
                        placements_t.c.model == copy.model,
                        placements_t.c.replica == copy.replica,
                    )
                    .values(
                        state=copy.state, state_since=now, endpoint=copy.endpoint, change_seq=seq
                    )
                )
            for p in updated:
                conn.execute(
                    update(placements_t)
                    .where(placements_t.c.model == p.model, placements_t.c.replica == p.replica)
                    .values(
                        memory_gb_per_node=p.memory_gb_per_node,
                        fingerprint=p.fingerprint,
                        version=p.version,
                        moving=p.moving,
                        moving_for=p.moving_for,
                        change_seq=seq,
                    )
                )
            record_failures(
                conn,
                {
                    (f.placement.model, n): f.reason
                    for f in plan.failures
                    for n in f.placement.nodes
                },
                now,
            )
            # A move's copy is placed for the move's reason; every other placement, for none.
            moved = {(m.copy.model, m.copy.replica): m.reason for m in plan.moves if m.copy}
            moved |= {
                (c.model, c.replica): f"placed again on {c.node}, where its engine still runs "
                f"({c.state}) after the node was given up"
                for c in plan.again
            }
            trail = [
                *((REPLICA_FAILED, f.placement, f.reason) for f in plan.failures),
                *((REMOVED, r.placement, r.reason) for r in plan.remove),
                *((PLACED, p, moved.get((p.model, p.replica), "")) for p in plan.place),
                *((UPDATED, p, _update_reason(before[(p.model, p.replica)], p)) for p in updated),
            ]
            append_trail(
                conn,
                (
                    *unreadable,
                    *(
                        TrailEntry(kind, p.model, p.replica, p.profile, p.nodes, reason)
                        for kind, p, reason in trail
                    ),
                ),
                now=now,
                round_id=round_id,
                catalog_position=catalog_position,
            )
        self._chain = chain
        return round_id


def _clear_unreadable(
    conn: Connection, place: Sequence[Placement], before: dict[tuple[str, int], Placement]
) -> list[TrailEntry]:
    """Delete stored placements that could not be read, in the slots the plan places into.

    Such a row was skipped when the plan's state was read, so the planner saw
    its slot as free; left there, it would make every round fail on the slot's
    key. Each deletion is a removal in the audit trail.
    """
    wanted = {(p.model, p.replica) for p in place} - before.keys()
    if not wanted:
        return []
    models = sorted({model for model, _ in wanted})
    stored = conn.execute(
        select(placements_t.c.model, placements_t.c.replica).where(placements_t.c.model.in_(models))
    ).all()
    taken = [(m, r) for m, r in stored if (m, r) in wanted]
    for model, replica in taken:
        conn.execute(
            delete(placements_t).where(
                placements_t.c.model == model, placements_t.c.replica == replica
            )
        )
    return [
        TrailEntry(REMOVED, model, replica, "", (), "its stored placement could not be read")
        for model, replica in taken
    ]


def _update_reason(before: Placement, after: Placement) -> str:
    if after.moving and after.moving != before.moving:
        return f"moving, surge-first: {after.moving}"
    if before.fingerprint != after.fingerprint or before.version != after.version:
        return "recorded what the replica runs (its fingerprint and version), for later rollouts"
    return "the profile's memory need changed"


def _unknown_status() -> ReplicaStatus:
    # Never expected: statuses are read from the same rows as the placements.
    epoch = datetime.fromtimestamp(0, UTC)
    return ReplicaStatus(PLACED_STATE, epoch, epoch, reported=False)


def _round_head(conn: Connection) -> int:
    return int(conn.execute(select(func.coalesce(func.max(rounds_t.c.id), 0))).scalar_one())


# A placement's slot, read in C: (model, replica), the store's key.
_slot = attrgetter("model", "replica")
