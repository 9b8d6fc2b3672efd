"""The placement scheduler inside ``llmgw serve --with-scheduler``.

The same ``Daemon`` as ``llmgw daemon``, with the same leadership
(``scheduler.daemon.leader``: a leadership lease on PostgreSQL, a flock on SQLite),
so a server with a scheduler, a separate daemon and other servers can run
against one database and exactly one of them places. It runs in a thread of
its own (APScheduler's blocking loop and signal handling belong to a process's
main thread, which uvicorn has), with its own ``CatalogService``: the API's is
guarded by a lock that a round should not hold for its duration.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Mapping
from datetime import datetime

import structlog
from sqlalchemy import Engine

from autoscale.policy import Policy
from events.catalog_service import CatalogService
from llmgw import autoscaling
from llmgw.api.telemetry.metrics import Metrics
from scheduler.daemon.leader import Leadership
from scheduler.daemon.loop import Daemon
from scheduler.daemon.round_runner import Placer, RoundOutcome
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.lease_store import Fence
from scheduler.persistence.serving_policy import ServingProcess
from scheduler.persistence.store import SchedulerStore

log = structlog.get_logger("llmgw.scheduler")


class ObservedPlacer(Placer):
    """A placer whose rounds are counted in the metrics."""

    def __init__(
        self,
        catalog: CatalogService,
        store: SchedulerStore,
        policy: StalenessPolicy,
        metrics: Metrics,
        wanted: Callable[[], Mapping[str, int]] | None = None,
        *,
        serving: ServingProcess | None = None,
    ) -> None:
        super().__init__(catalog, store, policy, wanted, serving=serving)
        self.metrics = metrics

    def run(
        self, *, dry_run: bool = False, now: datetime | None = None, fence: Fence | None = None
    ) -> RoundOutcome:
        outcome = super().run(dry_run=dry_run, now=now, fence=fence)
        if not dry_run:
            self.metrics.observe_round(outcome)
        return outcome


class ObservedLeadership:
    """Leadership whose state is the ``llmgw_scheduler_leader`` gauge, with the
    leadership lease's epoch (``llmgw_scheduler_leadership_epoch``) where there is one."""

    def __init__(self, inner: Leadership, metrics: Metrics) -> None:
        self.inner = inner
        self.metrics = metrics

    def ensure(self) -> bool:
        try:
            leading = self.inner.ensure()
        except Exception:
            self._show(False)
            raise
        self._show(leading)
        return leading

    def _show(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        fence = self.inner.fence() if leading else None
        self.metrics.leadership_epoch.set(0 if fence is None else fence.epoch)

    def holds(self) -> bool:
        held = self.inner.holds()
        if not held:
            self._show(False)
        return held

    def fence(self) -> Fence | None:
        return self.inner.fence()

    def release(self) -> None:
        self.inner.release()
        self._show(False)


class SchedulerThread:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmgw-scheduler", daemon=True)

    @classmethod
    def build(
        cls,
        *,
        catalog: CatalogService,
        store: SchedulerStore,
        policy: StalenessPolicy,
        leadership: Leadership,
        interval: float,
        metrics: Metrics,
        engine: Engine | None = None,
        autoscale: Policy | None = None,
        serving: ServingProcess | None = None,
    ) -> SchedulerThread:
        """``catalog`` must be a service of its own, not the API's (see the module).
        With ``engine`` and ``autoscale``, the autoscaler ticks before each round.
        ``serving``: the server, whose policy its rounds record when another is in force."""
        wanted, hook = None, None
        if engine is not None and autoscale is not None:
            wanted = autoscaling.wanted(engine, autoscale)
            hook = autoscaling.hook(autoscaling.autoscaler(engine, catalog, autoscale))
        placer = ObservedPlacer(catalog, store, policy, metrics, wanted, serving=serving)
        return cls(Daemon(placer, ObservedLeadership(leadership, metrics), interval, hook))

    def start(self) -> None:
        log.info("placement.started", interval_s=self.daemon.interval, in_server=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.daemon.round()  # logs and survives database outages itself
            except Exception as exc:  # a bug must not silently end placement
                log.error(
                    "placement.round_crashed",
                    error=repr(exc),
                    traceback="".join(traceback.format_exception(exc)),
                )
            self._stop.wait(self.daemon.interval)

    def stop(self) -> None:
        """Let the round in progress finish, then give up leadership."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.daemon.leadership.release()
        log.info("placement.stopped", rounds=self.daemon.rounds)
