"""Storage of the replica lifecycle: states reported by agents, cordons, failures.

Each state change, cordon and drain is also a placement event (with who caused
it, ``scheduler.persistence.audit_trail``), numbered in the same gapless sequence as a round's
events and under the same lock, so ``history --placements`` tells one story in
one order. Rows that cannot be read are skipped and named (``scheduler.persistence.row_decoding``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy import Connection, delete, insert, select, update

from scheduler.lifecycle.endpoints import NO_NETWORKS, EndpointPolicy, endpoint_problem
from scheduler.lifecycle.inputs import CORDONED, DRAINING, Cordon, FailureRecord, RunningCopy
from scheduler.lifecycle.replica_reports import FAILED, READY, STARTING, ReplicaStatus
from scheduler.persistence.audit_trail import (
    NODE_CORDONED,
    NODE_DRAINING,
    NODE_UNCORDONED,
    REPLICA_EVENT,
    REPLICA_FAILED,
    TrailEntry,
    append_trail,
    lock_trail,
)
from scheduler.persistence.placement_rows import (
    StoredPlacement,
    next_change,
    read_placements,
    reporting_changed,
    reporting_nodes,
)
from scheduler.persistence.record_format import UnreadableRow, checked
from scheduler.persistence.row_decoding import Row, decode_rows, raw
from scheduler.persistence.tables import (
    CordonRow,
    FailureRow,
    NodeRow,
    PlacementRow,
    RunningCopyRow,
    table,
)
from scheduler.planner.fleet.inventory import NodeReport

log = structlog.get_logger("llmgw.scheduler")
# (model, replica) pairs per read: two bound values each, well inside every driver's limit
# on parameters (SQLite 32,766).
KEYS_PER_READ = 500

nodes_t = table(NodeRow)
placements_t = table(PlacementRow)
cordons_t = table(CordonRow)
failures_t = table(FailureRow)
copies_t = table(RunningCopyRow)


def record_replica_reports(
    conn: Connection,
    reports: Sequence[NodeReport],
    now: datetime,
    actors: Sequence[str],
    *,
    addresses: Mapping[str, str] | None = None,
    endpoints: EndpointPolicy = NO_NETWORKS,
) -> None:
    """Apply the replica states in ``reports``; one event per state that changed.

    A report about a replica that is not placed on the reporting node (it was
    moved, or removed, or never existed) is ignored: a late report from the old
    node must not mark the replica's new placement ready. Such an engine, if it
    runs (starting or ready) with a known version and profile, is kept in
    ``running_copies`` (each report of the node's replicas replaces the node's
    rows): a node given up and back may have it placed again where it runs
    (``scheduler.planner.readoption``). An endpoint the node
    may not claim (``scheduler.lifecycle.endpoints``; ``addresses`` are the nodes'
    registered ones) is refused: the replica's state is recorded without it,
    and its message says why. Either is logged once per report, with counts
    and a few examples, however many replicas it names: a report of a thousand
    replicas must not write a thousand lines.
    """
    addresses = addresses or {}
    with_replicas = [r for r in reports if r.replicas is not None]
    actor_of = {id(r): a for r, a in zip(reports, actors, strict=True)}
    if not with_replicas:
        return
    _mark_reporting(conn, [r.name for r in with_replicas])
    # Only the replicas the batch reports on: by model, a model with thousands of
    # replicas (or a batch naming many models) read nearly every placement.
    keys = sorted({(rep.model, rep.replica) for r in with_replicas for rep in r.replicas or ()})
    if not keys:
        _replace_copies(conn, [r.name for r in with_replicas], [])
        return
    rows: dict[tuple[str, int], StoredPlacement] = {}
    for start in range(0, len(keys), KEYS_PER_READ):
        for stored in read_placements(conn, keys=keys[start : start + KEYS_PER_READ]):
            rows[(stored.placement.model, stored.placement.replica)] = stored
    trail: list[TrailEntry] = []
    writes: list[tuple[str, int, str, str | None, dict[str, Any]]] = []
    cleared: list[tuple[str, str]] = []
    # An engine reported for a replica not placed on its node: kept for the next round.
    _replace_copies(
        conn,
        [r.name for r in with_replicas],
        [
            copy
            for r in with_replicas
            for rep in r.replicas or ()
            if not _placed_on(rows.get((rep.model, rep.replica)), r.name)
            and (copy := _running_copy(r.name, rep, now, addresses, endpoints)) is not None
        ],
    )
    for report in with_replicas:
        actor = actor_of[id(report)]
        ignored: list[str] = []
        refused: list[tuple[str, str, str]] = []
        for rep in report.replicas or ():
            row = rows.get((rep.model, rep.replica))
            nodes = row.placement.nodes if row is not None else ()
            if row is None or report.name not in nodes:
                ignored.append(f"{rep.model}[{rep.replica}]")
                continue
            if rep.version and row.placement.version and rep.version != row.placement.version:
                # The slot was given to a new replica on the same node since the agent
                # looked: its engine of the old version must not mark the new one ready.
                # Counted in the report's one log line, like every ignored replica.
                ignored.append(
                    f"{rep.model}[{rep.replica}] of version {rep.version[:12]}, "
                    f"placed as {row.placement.version[:12]}"
                )
                continue
            endpoint, message = rep.endpoint, rep.message
            if endpoint is not None:
                problem = endpoint_problem(endpoint, addresses.get(report.name), endpoints)
                if problem is not None:
                    refused.append((f"{rep.model}[{rep.replica}]", endpoint, problem))
                    endpoint = None
                    message = f"endpoint {endpoint_shown(rep.endpoint)} refused: {problem}"
            changed = rep.state != row.state
            context = (rep.effective_context_length, rep.context_detail)
            if (
                not changed
                and message == row.message
                and endpoint == row.endpoint
                and context == (row.effective_context_length, row.context_detail)
            ):
                continue
            values: dict[str, Any] = {
                "message": message,
                "endpoint": endpoint,
                "effective_context_length": rep.effective_context_length,
                "context_detail": rep.context_detail,
            }
            if changed:
                values |= {"state": rep.state, "state_since": now}
                trail.append(
                    TrailEntry(
                        REPLICA_EVENT.format(state=rep.state),
                        rep.model,
                        rep.replica,
                        row.placement.profile,
                        nodes,
                        message or f"reported {rep.state} by node {report.name}",
                        actor,
                    )
                )
                if rep.state == READY:
                    cleared.append((rep.model, report.name))
            writes.append((rep.model, rep.replica, row.nodes_text, row.placement.version, values))
        _log_report(report.name, ignored, refused)
    if not writes:
        return
    _write_states(conn, writes)
    for model, node in cleared:
        conn.execute(
            delete(failures_t).where(failures_t.c.model == model, failures_t.c.node == node)
        )
    append_trail(conn, trail, now=now)


def _write_states(
    conn: Connection, writes: Sequence[tuple[str, int, str, str | None, dict[str, Any]]]
) -> None:
    """Write the states reported, stamped with this transaction's change number."""
    # Taken before any row is changed, in the order a round takes its locks,
    # so that a report and a round never wait for each other in a cycle.
    lock_trail(conn)
    seq = next_change(conn)
    for model, replica, nodes_text, version, values in writes:
        conn.execute(
            update(placements_t)
            .where(
                placements_t.c.model == model,
                placements_t.c.replica == replica,
                # Only the placement the agent reported on: not one placed since in its
                # slot (on other nodes, or of another version on the same ones).
                placements_t.c.nodes == nodes_text,
                placements_t.c.version == version,
            )
            .values(**values, change_seq=seq)
        )


def _mark_reporting(conn: Connection, names: Sequence[str]) -> None:
    """Mark the nodes as reporting replica states. Only those not yet: the set each
    replica's state reads changed, which a round's feed then reads again
    (``scheduler.persistence.placement_changes``)."""
    first = conn.execute(
        update(nodes_t)
        .where(nodes_t.c.name.in_(names), nodes_t.c.reports_replicas.is_not(True))
        .values(reports_replicas=True)
    )
    if first.rowcount:
        # Said under the numbering lock, taken before any row of placement_changes is
        # changed, as a round takes them (never a cycle of waits on PostgreSQL).
        lock_trail(conn)
        reporting_changed(conn)


# How many replicas a report's log line names, of those it ignored or refused.
EXAMPLES = 3


def _running_copy(
    node: str,
    rep: Any,
    now: datetime,
    addresses: Mapping[str, str],
    endpoints: EndpointPolicy,
) -> dict[str, Any] | None:
    """The row of an engine ``node`` runs for a replica not placed there, if a round could
    place it there again: running (starting or ready), of a known version and profile."""
    if rep.state not in (STARTING, READY) or not rep.version or not rep.profile:
        return None
    endpoint = rep.endpoint
    if endpoint is not None and endpoint_problem(endpoint, addresses.get(node), endpoints):
        endpoint = None  # the node may not claim it: kept without it, as for a placed one
    return {
        "node": node,
        "model": rep.model,
        "replica": rep.replica,
        "profile": rep.profile,
        "version": rep.version,
        "state": rep.state,
        "endpoint": endpoint,
        "reported_at": now,
    }


def _placed_on(row: StoredPlacement | None, node: str) -> bool:
    return row is not None and node in row.placement.nodes


def _replace_copies(
    conn: Connection, nodes: Sequence[str], copies: Sequence[dict[str, Any]]
) -> None:
    """Each report of a node's replicas replaces what it said it runs unplaced."""
    conn.execute(delete(copies_t).where(copies_t.c.node.in_(nodes)))
    if copies:
        conn.execute(insert(copies_t), list(copies))


def read_running_copies(conn: Connection) -> tuple[RunningCopy, ...]:
    """Every engine reported running where its replica is not placed, in key order."""
    rows = conn.execute(
        select(
            copies_t.c.node,
            copies_t.c.model,
            copies_t.c.replica,
            copies_t.c.profile,
            copies_t.c.version,
            copies_t.c.state,
            copies_t.c.endpoint,
        ).order_by(copies_t.c.node, copies_t.c.model, copies_t.c.replica)
    ).all()
    return tuple(
        RunningCopy(str(n), str(m), int(r), str(p), str(v), str(s), e)
        for n, m, r, p, v, s, e in rows
        if s in (STARTING, READY)
    )


def endpoint_shown(endpoint: str | None) -> str:
    text = endpoint or ""
    return text if len(text) <= 120 else text[:117] + "..."


def _log_report(node: str, ignored: Sequence[str], refused: Sequence[tuple[str, str, str]]) -> None:
    if ignored:
        log.info(
            "placement.report_ignored",
            node=node,
            ignored=len(ignored),
            replicas=list(ignored[:EXAMPLES]),
            reason="no such replica is placed on this node",
        )
    if refused:
        log.warning(
            "placement.endpoint_refused",
            node=node,
            refused=len(refused),
            replicas=[key for key, _, _ in refused[:EXAMPLES]],
            endpoints=[endpoint_shown(ep) for _, ep, _ in refused[:EXAMPLES]],
            reason=refused[0][2],
        )


def read_statuses(
    conn: Connection, placements: Sequence[StoredPlacement] | None = None
) -> dict[tuple[str, int], ReplicaStatus]:
    """Every placement's state; a node whose agent never reported replicas counts as unreported."""
    reporting = reporting_nodes(conn)
    rows = read_placements(conn) if placements is None else placements
    return {(r.placement.model, r.placement.replica): r.status(reporting) for r in rows}


def read_cordons(conn: Connection, nodes: Sequence[str] | None = None) -> dict[str, Cordon]:
    """The cordons by node (of ``nodes`` only, if given)."""
    query = raw(cordons_t).order_by(cordons_t.c.node)
    if nodes is not None:
        query = query.where(cordons_t.c.node.in_(nodes))
    cordons = decode_rows(
        conn,
        query,
        table="node_cordons",
        key=("node",),
        decode=_cordon,
        times=("since",),
    )
    return {c.node: c for c in cordons}


def read_failures(conn: Connection) -> tuple[FailureRecord, ...]:
    return tuple(
        decode_rows(
            conn,
            raw(failures_t).order_by(failures_t.c.model, failures_t.c.node),
            table="replica_failures",
            key=("model", "node"),
            decode=_failure,
            times=("last_failed_at",),
        )
    )


def _cordon(r: Row) -> Cordon:
    mode = checked(r, "mode", str)
    if mode not in (CORDONED, DRAINING):
        raise UnreadableRow(f"mode {mode!r} is neither {CORDONED} nor {DRAINING}")
    return Cordon(
        checked(r, "node", str),
        mode,
        checked(r, "actor", str),
        checked(r, "reason", str),
        r["since"],
    )


def _failure(r: Row) -> FailureRecord:
    return FailureRecord(
        checked(r, "model", str),
        checked(r, "node", str),
        checked(r, "failures", int),
        r["last_failed_at"],
        checked(r, "last_reason", str),
    )


def record_failures(conn: Connection, failed: Mapping[tuple[str, str], str], now: datetime) -> None:
    """Count one more failure of each (model, node), with its reason."""
    for (model, node), reason in sorted(failed.items()):
        row = conn.execute(
            select(failures_t.c.failures).where(
                failures_t.c.model == model, failures_t.c.node == node
            )
        ).first()
        if row is None:
            conn.execute(
                insert(failures_t),
                {
                    "model": model,
                    "node": node,
                    "failures": 1,
                    "last_failed_at": now,
                    "last_reason": reason,
                },
            )
        else:
            conn.execute(
                update(failures_t)
                .where(failures_t.c.model == model, failures_t.c.node == node)
                # A count that is not a count (a damaged row) starts again.
                .values(
                    failures=(row[0] if type(row[0]) is int else 0) + 1,
                    last_failed_at=now,
                    last_reason=reason,
                )
            )


def set_cordon(
    conn: Connection, node: str, mode: str | None, *, actor: str, reason: str, now: datetime
) -> Cordon | None:
    """Cordon, drain (``mode``) or uncordon (None) a node; the event says who and why.

    Returns the cordon as it was before. Setting the mode a node already has
    records nothing. A stored cordon that cannot be read (skipped, so None
    here) is replaced by this change, whatever it is.
    """
    lock_trail(conn)
    before = read_cordons(conn).get(node)
    stored = (
        conn.execute(select(cordons_t.c.node).where(cordons_t.c.node == node)).first() is not None
    )
    unreadable = stored and before is None
    if not unreadable and (before.mode if before else None) == mode:
        return before
    if mode is None:
        conn.execute(delete(cordons_t).where(cordons_t.c.node == node))
        kind = NODE_UNCORDONED
    else:
        values = {"mode": mode, "actor": actor, "reason": reason, "since": now}
        if not stored:
            conn.execute(insert(cordons_t), {"node": node, **values})
        else:
            conn.execute(update(cordons_t).where(cordons_t.c.node == node).values(**values))
        kind = NODE_DRAINING if mode == "draining" else NODE_CORDONED
    append_trail(conn, [TrailEntry(kind, "", -1, "", [node], reason, actor)], now=now)
    return before


__all__ = [
    "FAILED",
    "NODE_CORDONED",
    "NODE_DRAINING",
    "NODE_UNCORDONED",
    "REPLICA_FAILED",
    "TrailEntry",
    "append_trail",
    "lock_trail",
    "read_cordons",
    "read_failures",
    "read_running_copies",
    "read_statuses",
    "record_failures",
    "record_replica_reports",
    "set_cordon",
]
