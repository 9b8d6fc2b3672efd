"""The node inventory: what each agent last reported, stamped on the control plane's clock."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine, delete, select, update

from events.database.connection import WRITE
from scheduler.lifecycle.endpoints import NO_NETWORKS, EndpointPolicy
from scheduler.persistence.backend import backend
from scheduler.persistence.lifecycle_store import record_replica_reports
from scheduler.persistence.placement_rows import reporting_changed
from scheduler.persistence.record_format import (
    CURRENT_SCHEMA,
    NODE,
    VERSION,
    node_content,
    node_from_content,
)
from scheduler.persistence.row_decoding import Row, decode_rows, json_column, raw
from scheduler.persistence.tables import NodeRow, RunningCopyRow, table
from scheduler.planner.fleet.inventory import Node, NodeReport

nodes_t = table(NodeRow)
copies_t = table(RunningCopyRow)
# What the planner reads of a node, as stored: a report changing one of them is a change.
CONTENT_COLUMNS = ("gpu_class", "gpus", "gpus_reserved", "memory_gb", "labels", "fabric")


class InventoryStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def report(
        self,
        reports: Sequence[NodeReport],
        received_at: datetime,
        actor: str | Sequence[str] = "agent",
        endpoints: EndpointPolicy = NO_NETWORKS,
    ) -> list[Node]:
        """Record reports (each also a heartbeat) in one transaction, stamped on our clock.

        A report's replica states, if it has any, are recorded in the same
        transaction (``scheduler.persistence.lifecycle_store``), each change an event by its
        ``actor``: one for all, or one per report (the API commits the reports of
        many agents together). A node may appear once: an upsert cannot touch one
        row twice in one statement.
        """
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            return write_reports(conn, reports, received_at, actor, endpoints)

    def forget(self, name: str) -> bool:
        """Drop a node from the inventory (decommissioned); its replicas move next round.
        What it reported running unplaced goes with it."""
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            conn.execute(delete(copies_t).where(copies_t.c.node == name))
            forgotten = conn.execute(delete(nodes_t).where(nodes_t.c.name == name)).rowcount > 0
            if forgotten:
                # It may have reported replica states: their ``reported`` reads it.
                reporting_changed(conn)
            return forgotten

    def nodes(self) -> list[Node]:
        """Every node that can be read, by name; a row that cannot is skipped and named."""
        with self.engine.connect() as conn:
            return read_nodes(conn)


def write_reports(
    conn: Connection,
    reports: Sequence[NodeReport],
    received_at: datetime,
    actor: str | Sequence[str] = "agent",
    endpoints: EndpointPolicy = NO_NETWORKS,
) -> list[Node]:
    """``InventoryStore.report`` in a transaction the caller holds."""
    actors = [actor] * len(reports) if isinstance(actor, str) else list(actor)
    if len(actors) != len(reports):
        raise ValueError(f"{len(reports)} reports but {len(actors)} actors")
    nodes = [r.to_node(received_at) for r in reports]
    if not nodes:
        return nodes
    rows = [
        {
            **node_content(n),
            "labels": json.dumps(node_content(n)["labels"]),
            "reported_at": n.reported_at,
            "changed_at": n.reported_at,
        }
        for n in nodes
    ]
    # changed_at moves only when the content does (a round reads the nodes changed).
    backend(conn).upsert(conn, nodes_t, "name", rows, stamp=("changed_at", CONTENT_COLUMNS))
    addresses = register_addresses(conn, reports)
    record_replica_reports(
        conn, reports, received_at, actors, addresses=addresses, endpoints=endpoints
    )
    return nodes


def register_addresses(conn: Connection, reports: Sequence[NodeReport]) -> dict[str, str]:
    """Register the address of each reported node that has none yet; every one's address.

    Set once, never by a later report: an agent that could move its node's address
    could move where its endpoints may point. A node that really moved is forgotten
    (``llmgw nodes forget``) and registers again.
    """
    for r in reports:
        if r.address is not None:
            conn.execute(
                update(nodes_t)
                .where(nodes_t.c.name == r.name, nodes_t.c.address.is_(None))
                .values(address=r.address)
            )
    if not any(r.replicas for r in reports):
        return {}
    names = [r.name for r in reports if r.replicas]
    rows = conn.execute(
        select(nodes_t.c.name, nodes_t.c.address).where(nodes_t.c.name.in_(names))
    ).all()
    return {name: address for name, address in rows if address is not None}


def read_nodes(conn: Connection) -> list[Node]:
    return decode_rows(
        conn,
        raw(nodes_t).order_by(nodes_t.c.name),
        table="nodes",
        key=("name",),
        decode=node_from_row,
        times=("reported_at",),
    )


def node_from_row(r: Row) -> Node:
    # The row's columns are the current node content; "labels" is its one JSON column.
    content = {
        "name": r["name"],
        "gpu_class": r["gpu_class"],
        "gpus": r["gpus"],
        "gpus_reserved": r["gpus_reserved"],
        "memory_gb": r["memory_gb"],
        "labels": json_column(r["labels"], "labels"),
        "fabric": r["fabric"],
        VERSION: CURRENT_SCHEMA[NODE],
    }
    return node_from_content(content, r["reported_at"])


# One statement renews a batch of node leases (a heartbeat's renewal of ``reported_at``,
# llmgw.api.reports.leases): the names and times travel as one parameter (a JSON text), so
# a batch of 10,000 is one statement of fixed text rather than 20,000 bound values. A lease
# never moves back (a report or another replica's renewal may already be later); the nodes
# not renewed (forgotten meanwhile: no row) are named, so their agents are asked for a
# full report.
#
# On PostgreSQL the batch is one JSON object {name: epoch seconds} (json.dumps, in C: the
# two arrays it replaced were dumped element by element in Python, 40% of the writer's
# CPU at 10,000 leases a second), and the statement answers only the names it did not
# renew (none, nearly always) rather than every name it did.
_RENEW_POSTGRESQL = (
    "WITH lease AS (SELECT key AS name, to_timestamp(CAST(value AS float8)) AS at "
    "FROM json_each_text(CAST(%(leases)s AS json))), "
    "renewed AS (UPDATE nodes SET reported_at = GREATEST(nodes.reported_at, lease.at) "
    "FROM lease WHERE nodes.name = lease.name RETURNING nodes.name) "
    "SELECT name FROM lease EXCEPT SELECT name FROM renewed"
)
_RENEW_SQLITE = (
    "UPDATE nodes SET reported_at = MAX(nodes.reported_at, json_extract(lease.value, '$[1]')) "
    "FROM json_each(?) AS lease WHERE nodes.name = json_extract(lease.value, '$[0]') "
    "RETURNING nodes.name"
)


def renew_leases(conn: Connection, leases: Mapping[str, datetime]) -> set[str]:
    """Renew each node's lease to its time, in one statement; the names renewed."""
    if not leases:
        return set()
    names = sorted(leases)  # one order for every writer: row locks taken alike
    if conn.dialect.name == "postgresql":
        # In that order in the JSON text too (json_each_text keeps it).
        text = json.dumps({n: leases[n].timestamp() for n in names})
        rows = conn.exec_driver_sql(_RENEW_POSTGRESQL, {"leases": text})
        return leases.keys() - {name for (name,) in rows}
    # SQLAlchemy's SQLite DateTime text (UTC, naive, always with microseconds), so
    # the comparison of two texts is the comparison of two times.
    pairs = [[n, leases[n].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")] for n in names]
    rows = conn.exec_driver_sql(_RENEW_SQLITE, (json.dumps(pairs),))
    return {name for (name,) in rows}
