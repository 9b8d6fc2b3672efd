"""Recording agents' node reports: many agents' reports share one transaction.

See ``llmgw.api.reports.group_commit``: an agent's report is answered once it is
committed, as before, but the reports that arrive while one transaction commits
are written together in the next, so a fleet's heartbeats cost a commit per
batch rather than one each. The answer also needs each node's service state
(cordoned, draining, replicas left); it is read once per batch, in the batch's
transaction, instead of once per report, at a cost that follows the batch, not the
cluster: the batch's nodes' cordons, and replica counts kept until a round is
written (``scheduler.persistence.round_store.HostedCounts``).

A report reaches the writer either parsed (the route, which parsed it in a
worker thread) or as the body received (``llmgw.api.routes.report_fast_path``, the common
case: a small JSON body), which the writer thread parses with the same rules
(``read_report``) before the batch is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from catalog.reading.documents import NotJSON
from llmgw.api.guards.bodies import ORIGIN, parse
from llmgw.api.rendering.problems import Problem
from llmgw.api.reports.group_commit import GroupCommit
from llmgw.api.reports.leases import LeaseBook
from llmgw.api.telemetry.metrics import Metrics
from scheduler.lifecycle.endpoints import NO_NETWORKS, EndpointPolicy
from scheduler.lifecycle.inputs import Cordon
from scheduler.persistence.store import SchedulerStore
from scheduler.planner.fleet.inventory import Node, NodeReport, NodeReportError, parse_node_report


@dataclass(frozen=True, slots=True)
class Body:
    """A report as received: the path's node name and the raw body, not parsed yet."""

    name: str
    raw: bytes
    limit: int


__all__ = ["Body", "NotJSON", "Recorded", "Sent", "node_report_writer", "read_report"]

# An agent's report (parsed, or its body) and the name of the token it came with (the
# actor of its events).
Sent = tuple[NodeReport | Body, str]
# The node as recorded, its cordon if any, how many replicas it hosts, and the id of the
# report (what the node's heartbeats name: llmgw.api.reports.leases).
Recorded = tuple[Node, Cordon | None, int, str]


def read_report(name: str, body: bytes, limit: int, *, json_only: bool = False) -> NodeReport:
    """The report a body holds for node ``name``; a ``Problem`` (413 or 422) if none.

    Blocking and as costly as the body allows: never on the event loop. With
    ``json_only``, a body that is not JSON raises ``NotJSON`` (it may be YAML).
    """
    data = parse(body, limit, "invalid-node-report", json_only=json_only)
    if not isinstance(data, dict):
        raise Problem(422, "invalid-node-report", f"{ORIGIN}: a node report is a mapping of fields")
    if "name" not in data:
        data = {**data, "name": name}
    elif data["name"] != name:
        raise Problem(
            422,
            "invalid-node-report",
            f"{ORIGIN} reports node {data['name']!r} but the path names {name!r}; "
            "they must match (or leave name out of the body)",
        )
    try:
        return parse_node_report(data)
    except NodeReportError as exc:
        raise Problem(
            422, "invalid-node-report", "; ".join(exc.problems), problems=list(exc.problems)
        ) from None


def unstorable(exc: OverflowError) -> Problem:
    """SQLite's integers stop at 2**63 (PostgreSQL's refusal is a ``DataError``)."""
    return Problem(422, "invalid-node-report", f"the database cannot store a value: {exc}")


def _prepare(sent: Sent) -> Sent:
    what, actor = sent
    if isinstance(what, NodeReport):
        return what, actor
    # The writer thread reads JSON only: a YAML body (whose parser costs far more per
    # byte) goes to the route's worker threads, where it delays no one else's commit.
    return read_report(what.name, what.raw, what.limit, json_only=True), actor


def node_report_writer(
    nodes: SchedulerStore,
    writing: AbstractContextManager[Any],
    metrics: Metrics,
    endpoints: EndpointPolicy = NO_NETWORKS,
    leases: LeaseBook | None = None,
) -> GroupCommit[Sent, Recorded]:
    def write(batch: Sequence[Sent]) -> list[Recorded]:
        reports = [report for report, _ in batch if isinstance(report, NodeReport)]
        assert len(reports) == len(batch)  # _prepare parsed every body
        with writing:
            # The nodes' service state is read in the batch's own transaction: it is the
            # same state a read after the commit would see, for one transaction less.
            recorded, cordons, hosted = nodes.report_and_service(
                reports,
                datetime.now(UTC),
                actor=[a for _, a in batch],
                endpoints=endpoints,
            )
        metrics.node_report_commits.inc()
        for report in reports:
            if report.server_switches is not None:  # an older agent does not say it
                metrics.agent_switches.saw(report.name, report.server_switches)
        # Held only once committed: a heartbeat naming it renews a node that is stored.
        ids = [leases.accepted(n.name) if leases else "" for n in recorded]
        return [
            (n, cordons.get(n.name), hosted.get(n.name, 0), report_id)
            for n, report_id in zip(recorded, ids, strict=True)
        ]

    return GroupCommit(write, key=lambda sent: sent[0].name, prepare=_prepare)
