"""Node leases: a heartbeat renews its node's lease in memory; the leases are written in
batches, one statement at most once a second.

An agent whose node has not changed since its last accepted report sends a heartbeat
naming that report (``llmgw.api.reports.heartbeat_listener``) rather than the report
again. A node's *lease* is its ``reported_at``: the time the control plane last heard
from it, by a report or a heartbeat. Staleness is judged from it, as before, by every
replica sharing the database (``scheduler.lifecycle.staleness``), so the node states
keep their meaning; a renewal reaches the database within one flush period (1 s), so
they keep their timing within a second.

Every report this process commits gets a *report id* (this process's random instance id
and a counter), answered to the agent and held here as the node's report. A heartbeat is
taken only if it names the report held for its node: a report id is unique to one
process's run, so a heartbeat that names a report this process did not accept (a
restarted server, another replica, a report lost on the way) is answered "send the full
report", and the state heals within one interval. A node whose row is gone when its
lease is written (``llmgw nodes forget``) is dropped too: its next heartbeat is asked
for the full report, which registers it again, as a report always did.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

import structlog

from llmgw.api.reports.placement_generations import PlacementGenerations
from llmgw.api.telemetry.metrics import Metrics
from scheduler.persistence.store import SchedulerStore

log = structlog.get_logger("llmgw.api")

# At most one lease write a second per process (the bound: the database sees one
# statement a second from each replica however many nodes beat).
FLUSH_PERIOD_S = 1.0


class LeaseBook:
    """The report each node last had accepted here, and the leases waiting to be written."""

    def __init__(
        self,
        store: SchedulerStore,
        writing: AbstractContextManager[Any],
        metrics: Metrics | None = None,
        period_s: float = FLUSH_PERIOD_S,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._writing = writing
        self.period_s = period_s
        self.instance = secrets.token_hex(6)
        self._count = itertools.count(1)
        # node -> the id of the report this process last committed for it.
        self._held: dict[str, str] = {}
        # node -> (latest heartbeat's time, the report it named); swapped out by a flush.
        self._pending: dict[str, tuple[datetime, str]] = {}
        self._lock = threading.Lock()
        # The heartbeat listener's port once it listens (told to agents with each report).
        self.port: int | None = None
        self.heartbeats = 0  # taken (the metrics and the benchmark read these)
        self.refused = 0  # answered "send the full report"
        self.flushes = 0
        self.written = 0
        # Each node's placement generation, told with its heartbeats' answers; followed
        # from the placement trail by the writer's thread, after each flush.
        self.generations = PlacementGenerations(store)

    # -- reports ------------------------------------------------------------------

    def accepted(self, name: str) -> str:
        """A report of ``name`` is committed: its new id, now the one heartbeats must name."""
        report_id = f"{self.instance}.{next(self._count)}"
        self._held[name] = report_id
        return report_id

    def held(self, name: str) -> str | None:
        return self._held.get(name)

    # -- heartbeats ---------------------------------------------------------------

    def renew(self, beats: Iterable[tuple[str, str]], at: datetime) -> list[bool]:
        """Renew the lease of each ``(node, report id)`` whose report is held; per beat,
        whether it was (False: the agent must send its full report)."""
        held, answers = self._held, []
        with self._lock:
            pending = self._pending
            for name, report_id in beats:
                ok = held.get(name) == report_id
                if ok:
                    pending[name] = (at, report_id)
                answers.append(ok)
        taken = sum(answers)
        self.heartbeats += taken
        self.refused += len(answers) - taken
        if self._metrics is not None:
            self._metrics.node_heartbeats.inc(taken)
            if taken < len(answers):
                self._metrics.node_heartbeats_refused.inc(len(answers) - taken)
        return answers

    # -- writing ------------------------------------------------------------------

    def flush(self) -> int:
        """Write the pending leases in one statement; how many nodes it renewed."""
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return 0
        try:
            with self._writing:
                renewed = self._store.renew_leases({n: at for n, (at, _) in batch.items()})
        except Exception as exc:
            # Kept for the next flush (a later heartbeat's time wins): a database that
            # is down for a while delays the leases, it does not lose them.
            with self._lock:
                for name, entry in batch.items():
                    self._pending.setdefault(name, entry)
            log.warning("api.lease_write_failed", nodes=len(batch), error=str(exc)[:500])
            return 0
        for name in batch.keys() - renewed:
            # No row (forgotten): its next heartbeat is asked for the full report.
            if self._held.get(name) == batch[name][1]:
                self._held.pop(name, None)
        self.flushes += 1
        self.written += len(renewed)
        if self._metrics is not None:
            self._metrics.node_lease_writes.inc()
        return len(renewed)

    def run(self, stopping: threading.Event, clock: Callable[[], float] = time.monotonic) -> None:
        """Flush every ``period_s`` until ``stopping``; then once more."""
        next_at = clock() + self.period_s
        self.follow()
        while not stopping.wait(max(0.0, next_at - clock())):
            next_at = clock() + self.period_s
            self.flush()
            self.follow()
        self.flush()

    def follow(self) -> None:
        """Follow the placement trail (``PlacementGenerations``); a failure is logged and
        the next period tries again (meanwhile the generations told are the last known)."""
        try:
            self.generations.follow()
        except Exception as exc:
            log.warning("api.placement_trail_unread", error=str(exc)[:500])

    def start(self, stopping: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stopping,), name="node-leases")
        thread.daemon = True
        thread.start()
        return thread
