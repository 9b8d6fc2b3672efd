"""The recorded inputs of a round beyond catalog, inventory and placements.

A round now also depends on what agents said about their replicas, on the
nodes operators cordoned or are draining, and on where a model's replicas
failed recently. All three are read once per round and recorded with it
(``to_json``), so the planner stays a pure function of its inputs and a
recorded round can still be planned again, and explained, exactly as it ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from scheduler.lifecycle.replica_reports import ReplicaStatus

CORDONED = "cordoned"
DRAINING = "draining"
DEFAULT_STARTUP_TIMEOUT = timedelta(minutes=20)


@dataclass(frozen=True, slots=True)
class ModelLifecycle:
    """What a round needs to know of one model to run its replicas' lifecycle.

    ``fingerprints`` and ``startup_timeouts`` are by profile name; a replica
    whose recorded fingerprint differs from its profile's is replaced by a
    rollout bounded by ``max_surge`` and ``max_unavailable``.
    """

    fingerprints: Mapping[str, str] = field(default_factory=dict)
    startup_timeouts: Mapping[str, timedelta] = field(default_factory=dict)
    max_surge: int = 1
    max_unavailable: int = 0
    # The model's version (``catalog.changes.digest.model_version``): what a new replica is
    # pinned to. "" plans as before versions (nothing pinned).
    version: str = ""
    # Its ``disruption:`` budget (catalog.definition.model.Disruption) and ``scaling.min``: how many
    # of its replicas defragmentation and spread repair may have in motion at once.
    min_ready: int = 0
    movable: bool = True
    max_moving: int | str | None = None
    repair_spread: bool = False


@dataclass(frozen=True, slots=True)
class Cordon:
    """A node an operator took out of service.

    Cordoned: nothing new lands there, what runs stays. Draining: also, its
    replicas are replaced elsewhere, surge-first, and removed once their
    replacements are ready.
    """

    node: str
    mode: str  # CORDONED or DRAINING
    actor: str
    reason: str
    since: datetime

    @property
    def draining(self) -> bool:
        return self.mode == DRAINING


@dataclass(frozen=True, slots=True)
class FailureRecord:
    """How often replicas of ``model`` failed on ``node``, and the last time and why."""

    model: str
    node: str
    failures: int
    last_failed_at: datetime
    last_reason: str


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """How long a node is avoided for a model after its replicas failed there.

    The n-th failure in a row avoids the node for ``base * 2**(n-1)``, at most
    ``cap``: a node that fails a model once may have had a bad minute, one that
    fails it every time should stop being offered it, but never forever, since
    the fault may be fixed. A replica that becomes ready there clears the count.
    """

    base: timedelta = timedelta(minutes=1)
    cap: timedelta = timedelta(hours=1)

    def wait(self, failures: int) -> timedelta:
        """How long the ``failures``-th failure in a row keeps a node avoided."""
        steps = min(max(failures, 1) - 1, 30)
        wait: timedelta = min(self.base * (2**steps), self.cap)
        return wait

    def until(self, record: FailureRecord) -> datetime:
        return record.last_failed_at + self.wait(record.failures)


DEFAULT_BACKOFF = BackoffPolicy()


@dataclass(frozen=True, slots=True)
class RunningCopy:
    """An engine a node's agent reports running for a replica not placed on that node.

    What a node given up and back again still runs (``scheduler.planner.readoption``):
    ``profile`` and ``version`` are what it was started with, ``state`` starting or ready.
    """

    node: str
    model: str
    replica: int
    profile: str
    version: str
    state: str
    endpoint: str | None = None


@dataclass(frozen=True, slots=True)
class Lifecycle:
    """Replica states by (model, replica), cordons by node, failure records, back-off policy.

    Empty by default: a round without lifecycle inputs plans as before.
    """

    statuses: Mapping[tuple[str, int], ReplicaStatus] = field(default_factory=dict)
    cordons: Mapping[str, Cordon] = field(default_factory=dict)
    failures: tuple[FailureRecord, ...] = ()
    backoff: BackoffPolicy = DEFAULT_BACKOFF
    # Engines running where their replica is not placed, by (node, model, replica).
    running: tuple[RunningCopy, ...] = ()

    @property
    def closed_nodes(self) -> frozenset[str]:
        """Nodes that take no new replica: cordoned or draining."""
        return frozenset(self.cordons)

    @property
    def draining_nodes(self) -> frozenset[str]:
        return frozenset(n for n, c in self.cordons.items() if c.draining)

    def avoided(self, now: datetime) -> dict[str, dict[str, FailureRecord]]:
        """Per model, the nodes still backing off at ``now``, with their record."""
        out: dict[str, dict[str, FailureRecord]] = {}
        for record in self.failures:
            if now < self.backoff.until(record):
                out.setdefault(record.model, {})[record.node] = record
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "statuses": [status_json(key, s) for key, s in sorted(self.statuses.items())],
            "cordons": [
                {
                    "node": c.node,
                    "mode": c.mode,
                    "actor": c.actor,
                    "reason": c.reason,
                    "since": c.since.isoformat(),
                }
                for _, c in sorted(self.cordons.items())
            ],
            "failures": [
                {
                    "model": f.model,
                    "node": f.node,
                    "failures": f.failures,
                    "last_failed_at": f.last_failed_at.isoformat(),
                    "last_reason": f.last_reason,
                }
                for f in self.failures
            ],
            "backoff": {
                "base_s": self.backoff.base.total_seconds(),
                "cap_s": self.backoff.cap.total_seconds(),
            },
            "running": [
                {
                    "node": c.node,
                    "model": c.model,
                    "replica": c.replica,
                    "profile": c.profile,
                    "version": c.version,
                    "state": c.state,
                    "endpoint": c.endpoint,
                }
                for c in self.running
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Lifecycle:
        """The inverse of ``to_json``; None (a round recorded before lifecycles) is empty."""
        if data is None:
            return cls()
        when = datetime.fromisoformat
        return cls(
            statuses={
                (s["model"], s["replica"]): ReplicaStatus(
                    state=s["state"],
                    since=when(s["since"]),
                    placed_at=when(s["placed_at"]),
                    message=s["message"],
                    endpoint=s["endpoint"],
                    reported=s["reported"],
                    # Absent from rounds recorded before the engines' context was read.
                    effective_context_length=s.get("effective_context_length"),
                    context_detail=s.get("context_detail", ""),
                )
                for s in data["statuses"]
            },
            cordons={
                c["node"]: Cordon(c["node"], c["mode"], c["actor"], c["reason"], when(c["since"]))
                for c in data["cordons"]
            },
            failures=tuple(
                FailureRecord(
                    f["model"],
                    f["node"],
                    f["failures"],
                    when(f["last_failed_at"]),
                    f["last_reason"],
                )
                for f in data["failures"]
            ),
            backoff=BackoffPolicy(
                base=timedelta(seconds=data["backoff"]["base_s"]),
                cap=timedelta(seconds=data["backoff"]["cap_s"]),
            ),
            # Absent from rounds recorded before running copies were kept (0016).
            running=tuple(
                RunningCopy(
                    c["node"],
                    c["model"],
                    c["replica"],
                    c["profile"],
                    c["version"],
                    c["state"],
                    c["endpoint"],
                )
                for c in data.get("running", [])
            ),
        )


def status_json(key: tuple[str, int], s: ReplicaStatus) -> dict[str, Any]:
    """One replica's state as ``Lifecycle.to_json`` records it."""
    model, replica = key
    return {
        "model": model,
        "replica": replica,
        "state": s.state,
        "since": s.since.isoformat(),
        "placed_at": s.placed_at.isoformat(),
        "message": s.message,
        "endpoint": s.endpoint,
        "reported": s.reported,
        "effective_context_length": s.effective_context_length,
        "context_detail": s.context_detail,
    }
