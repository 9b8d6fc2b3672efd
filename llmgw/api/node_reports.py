"""Recording agents' node reports: many agents' reports share one transaction.

See ``llmgw.api.group_commit``: an agent's report is answered once it is
committed, as before, but the reports that arrive while one transaction commits
are written together in the next, so a fleet's heartbeats cost a commit per
batch rather than one each. The answer also needs each node's service state
(cordoned, draining, replicas left); it is read once per batch, after the
commit, instead of once per report.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

from llmgw.api.group_commit import GroupCommit
from llmgw.api.metrics import Metrics
from scheduler import Node, NodeReport
from scheduler.lifecycle import Cordon
from scheduler.store import SchedulerStore

# An agent's report and the name of the token it came with (the actor of its events).
Sent = tuple[NodeReport, str]
# The node as recorded, its cordon if any, and how many replicas it hosts.
Recorded = tuple[Node, Cordon | None, int]


def node_report_writer(
    nodes: SchedulerStore, writing: AbstractContextManager[Any], metrics: Metrics
) -> GroupCommit[Sent, Recorded]:
    def write(batch: Sequence[Sent]) -> list[Recorded]:
        with writing:
            recorded = nodes.report(
                [report for report, _ in batch], datetime.now(UTC), actor=[a for _, a in batch]
            )
        metrics.node_report_commits.inc()
        cordons, hosted = nodes.service()
        return [(n, cordons.get(n.name), hosted.get(n.name, 0)) for n in recorded]

    return GroupCommit(write, key=lambda sent: sent[0].name)
