"""The policy the server runs with, recorded, so that every reader of the database judges
as the server does.

``llmgw status``, ``nodes list``, ``place --dry-run`` and ``explain`` run in processes of
their own, often on other machines, with settings of their own. Judging a node's silence
by those, they contradicted the server: started with ``--stale-after 3 --grace 3``, it
had given up a killed agent's node and moved its replicas while the CLI, on its defaults
(90 s / 5 min), still called the node fresh and would have placed a replica there.

Two records say what the server runs with:

- every recorded round's policy (``placement_rounds.policy``): what the placer ran with;
- ``serving_policies``: a row when ``llmgw serve`` or ``llmgw daemon`` starts, and one
  when a placer places while the policy in force (below) is not its own: it took over
  from a leader with another policy, or a standby with another policy started since. A
  round that changes nothing is not recorded, so without these rows a server restarted
  with another policy would leave no trace of it until something changed.

The policy in force (``read_policy_in_force``) is the newer of the last round's and the
newest placer's row (``places``: ``serve --with-scheduler`` or ``daemon``): it is what
moves replicas. Without either, the newest row of a server without a scheduler (its
``/v1/nodes`` judges by it). A row that cannot be read is skipped and named (like every
scheduler row, ``scheduler.persistence.row_decoding``), and the one before it is used; at
most ``SEARCH`` rows of each kind are looked at. Only the newest ``KEPT_POLICIES`` rows of
``serving_policies`` are kept: a server in a restart loop cannot fill the table.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, insert, select

from events.database.connection import WRITE
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.lease_store import Fence
from scheduler.persistence.record_format import UnreadableRow, policy_from_record, policy_json
from scheduler.persistence.row_decoding import (
    Row,
    Unreadable,
    decode_one,
    json_column,
    raw,
)
from scheduler.persistence.tables import PlacementRoundRow, ServingPolicyRow, table

policies_t = table(ServingPolicyRow)
rounds_t = table(PlacementRoundRow)

# Rows of serving_policies kept; older ones are deleted as new ones are written.
KEPT_POLICIES = 100
# Rows of each kind looked at, newest first, for one that can be read.
SEARCH = 20
ROUND = "round"
STARTED = "started"
PLACING = "placing"


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    """A recorded policy, and who recorded it when: a round, or a serving process."""

    policy: StalenessPolicy
    recorded_at: datetime
    source: str  # ROUND, STARTED or PLACING
    round_id: int | None = None
    process: str = ""  # serve or daemon; "" for a round
    places: bool = True
    host: str = ""
    pid: int | None = None
    instance: str = ""
    interval_s: float | None = None


@dataclass(frozen=True, slots=True)
class PolicyInForce:
    """The policy in force (None: nothing recorded that can be read), and the rows skipped
    on the way, each named with its reason ("round 44: ...")."""

    record: PolicyRecord | None
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ServingProcess:
    """Who records: one per process (``instance`` tells its rows from another's)."""

    process: str
    places: bool
    interval_s: float | None = None
    instance: str = field(default_factory=lambda: uuid.uuid4().hex)
    host: str = field(default_factory=lambda: socket.gethostname()[:255])
    pid: int = field(default_factory=os.getpid)


def policy_fields(policy: StalenessPolicy) -> dict[str, Any]:
    """A policy as log fields (``placement.policy_recorded``, ``api.policy_recorded``)."""
    return {
        "stale_after_s": policy.stale_after.total_seconds(),
        "grace_s": policy.grace.total_seconds(),
        "preemption": policy.preemption,
        "defragment": policy.defragment,
        "repair_spread": policy.repair_spread,
    }


def record_policy(
    engine: Engine,
    who: ServingProcess,
    policy: StalenessPolicy,
    *,
    why: str,
    now: datetime,
    fence: Fence | None = None,
) -> None:
    """Write one row of ``serving_policies`` and delete those past ``KEPT_POLICIES``.

    ``fence``: a placer's leadership lease, checked first in the transaction like every
    other write of a round (``LeadershipLost``, and nothing written, when not current):
    an old leader woken from a freeze must not record the policy it no longer places by.
    """
    with engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
        if fence is not None:
            fence(conn)
        conn.execute(
            insert(policies_t),
            {
                "recorded_at": now,
                "instance": who.instance,
                "process": who.process,
                "places": who.places,
                "why": why,
                "host": who.host,
                "pid": who.pid,
                "interval_s": who.interval_s,
                "policy": policy_json(policy),
            },
        )
        newest = conn.execute(select(func.max(policies_t.c.id))).scalar_one()
        conn.execute(delete(policies_t).where(policies_t.c.id <= int(newest) - KEPT_POLICIES))


def claim_policy(
    engine: Engine,
    who: ServingProcess,
    policy: StalenessPolicy,
    now: datetime,
    fence: Fence | None = None,
) -> bool:
    """Before a placer's round: record its policy if the policy in force is another.

    Returns whether a row was written. Two small reads a round (the newest round's and
    the newest placer's row); a write only when the policy in force changes hands, and
    then fenced (``record_policy``).
    """
    with engine.connect() as conn:
        found = read_policy_in_force(conn).record
    if found is not None and found.policy == policy:
        return False
    record_policy(engine, who, policy, why=PLACING, now=now, fence=fence)
    return True


def read_policy_in_force(conn: Connection) -> PolicyInForce:
    """The policy the server runs with, as recorded (see the module)."""
    skipped: list[str] = []
    last_round = _newest_round(conn, skipped)
    placer = _newest_record(conn, skipped, places=True)
    found = [r for r in (last_round, placer) if r is not None]
    if found:
        return PolicyInForce(max(found, key=lambda r: r.recorded_at), tuple(skipped))
    return PolicyInForce(_newest_record(conn, skipped, places=False), tuple(skipped))


def _newest_round(conn: Connection, skipped: list[str]) -> PolicyRecord | None:
    query = raw(rounds_t, "id", "planned_at", "policy").order_by(rounds_t.c.id.desc())
    for row in conn.execute(query.limit(SEARCH)).mappings().all():
        found = decode_one(
            conn,
            row,
            table="placement_rounds",
            key=("id",),
            decode=_round_policy,
            times=("planned_at",),
        )
        if not isinstance(found, Unreadable):
            return found
        skipped.append(f"round {row['id']}: {found.reason}")
    return None


def _round_policy(r: Row) -> PolicyRecord:
    if type(r["id"]) is not int:
        raise UnreadableRow(f"id {r['id']!r} is not a round number")
    return PolicyRecord(
        policy=policy_from_record(json_column(r["policy"], "policy")),
        recorded_at=r["planned_at"],
        source=ROUND,
        round_id=r["id"],
    )


def _newest_record(conn: Connection, skipped: list[str], *, places: bool) -> PolicyRecord | None:
    query = (
        raw(policies_t)
        .where(policies_t.c.places == places)
        .order_by(policies_t.c.id.desc())
        .limit(SEARCH)
    )
    for row in conn.execute(query).mappings().all():
        found = decode_one(
            conn,
            row,
            table="serving_policies",
            key=("id",),
            decode=_process_policy,
            times=("recorded_at",),
        )
        if not isinstance(found, Unreadable):
            return found
        skipped.append(f"serving policy {row['id']}: {found.reason}")
    return None


def _process_policy(r: Row) -> PolicyRecord:
    interval = r["interval_s"]
    if interval is not None and type(interval) not in (int, float):
        raise UnreadableRow(f"interval_s {interval!r} is not a number")
    why = _text(r, "why", 32)
    if why not in (STARTED, PLACING):
        raise UnreadableRow(f"why {why!r} is neither {STARTED} nor {PLACING}")
    pid = r["pid"]
    if type(pid) is not int:
        raise UnreadableRow(f"pid {pid!r} is not a number")
    return PolicyRecord(
        policy=policy_from_record(json_column(r["policy"], "policy")),
        recorded_at=r["recorded_at"],
        source=why,
        process=_text(r, "process", 32),
        places=bool(r["places"]),
        host=_text(r, "host", 255),
        pid=pid,
        instance=_text(r, "instance", 64),
        interval_s=None if interval is None else float(interval),
    )


def _text(r: Row, name: str, limit: int) -> str:
    value: Any = r[name]
    if type(value) is not str or len(value) > limit:
        raise UnreadableRow(f"{name} {str(value)[:60]!r} is not text of at most {limit} characters")
    return value
