"""The placement daemon: rounds on a timer (APScheduler), as leader only, surviving outages.

- One structured log line per round (``placement.round``) with stable fields:
  round, catalog_position, nodes, placed, removed, unplaced, duration_ms; and
  ``replica.failed`` per failure, ``placement.rollout`` per rollout in progress.
- SIGTERM or SIGINT lets the running round finish, then the process exits 0. A second
  signal while it finishes (a round stuck on a lock or a slow database) ends the process
  at once (``placement.stop_forced``, exit status 128 + the signal's number, as a shell
  reports a killed process): the database rolls back what the round had not committed
  (its writes are one transaction: all or nothing), and the leadership lease lapses by
  its own terms.
- A database that cannot be reached is logged (``placement.round_failed``)
  and tried again next round; nothing is duplicated when it comes back,
  because a round's writes are one fenced transaction.
- Only the leader places (see ``scheduler.daemon.leader``); the others log
  ``placement.waiting`` and try again every round. A leader whose leadership lease
  may have lapsed by its own clock stops before its next write
  (``placement.lease_lapsed``), and a write refused because another took the lease
  over is logged as ``placement.fenced``: nothing of that round was written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType
from typing import NoReturn

import structlog
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.exc import DBAPIError

from scheduler.daemon.leader import Leadership
from scheduler.daemon.round_runner import Placer
from scheduler.persistence.lease_store import Fence, LeadershipLost
from scheduler.persistence.round_store import RoundConflict

log = structlog.get_logger("llmgw.scheduler")


class Daemon:
    def __init__(
        self,
        placer: Placer,
        leadership: Leadership,
        interval: float,
        before_round: Callable[[datetime, Fence | None], object] | None = None,
    ) -> None:
        """``before_round(now, fence)`` runs as leader before each round (the autoscaler's
        tick, wired by the composition root), so the round places what it just decided;
        its writes check ``fence`` in their transaction, as the round's do."""
        self.placer = placer
        self.before_round = before_round
        self.leadership = leadership
        self.interval = interval
        self.rounds = 0
        self._leading = False
        self._lock = threading.Lock()

    def round(self) -> None:
        """One tick: lead or wait, then plan and write. Never raises."""
        with self._lock:
            self.rounds += 1
            try:
                leading = self.leadership.ensure()
                if leading != self._leading:
                    log.info("placement.leadership", leading=leading, round=self.rounds)
                    self._leading = leading
                if not leading:
                    log.info("placement.waiting", round=self.rounds)
                    return
                if self.before_round is not None:
                    self.before_round(datetime.now(UTC), self.leadership.fence())
                if not self.leadership.holds():
                    # A slow tick or a pause: the lease may have lapsed and another
                    # replica may lead now. Nothing more this round.
                    log.warning("placement.lease_lapsed", round=self.rounds)
                    self._leading = False
                    return
                outcome = self.placer.run(fence=self.leadership.fence())
            except LeadershipLost as fenced:
                self._leading = False
                log.warning("placement.fenced", round=self.rounds, reason=str(fenced))
                return
            except RoundConflict as conflict:
                log.warning("placement.round_conflict", round=self.rounds, reason=str(conflict))
                return
            except DBAPIError as exc:
                self._leading = False
                log.error(
                    "placement.round_failed",
                    round=self.rounds,
                    error=str(exc.orig or exc).strip().splitlines()[0],
                )
                return
            plan = outcome.plan
            log.info(
                "placement.round",
                round=self.rounds,
                recorded_round=outcome.round_id,
                catalog_position=outcome.catalog_position,
                nodes=outcome.node_count,
                placed=len(plan.place),
                removed=len(plan.remove),
                unplaced=len(plan.unplaced),
                kept=len(plan.keep),
                mass_loss=plan.mass_loss,
                duration_ms=round(outcome.duration_ms, 2),
            )
            if plan.strategy != "policy":
                # The spread layout lost the quality floor to a baseline: its replicas are
                # spread afterwards by swaps, but an operator should know it happened.
                log.warning(
                    "placement.fallback",
                    round=self.rounds,
                    strategy=plan.strategy,
                    placed=len(plan.place),
                    unplaced=len(plan.unplaced),
                    detail=f"{plan.strategy} placed more GPUs than the spread layout; "
                    "its replicas were spread afterwards by same-shape swaps",
                )
            if plan.mass_loss:
                # Kept, not moved: so many nodes look lost at once that a clock jump or a
                # partition on our side is likelier. An operator must look.
                lost = set(plan.lost_nodes)
                log.warning(
                    "placement.mass_loss_held",
                    round=self.rounds,
                    lost_nodes=sorted(lost),
                    held=sum(1 for p in plan.keep if lost.intersection(p.nodes)),
                    detail="replicas on nodes that look lost are kept; if the nodes are "
                    "really gone, `llmgw nodes forget` them",
                )
            for removal in plan.remove:
                p = removal.placement
                log.info(
                    "placement.removed", model=p.model, replica=p.replica, reason=removal.reason
                )
            for p in plan.place:
                log.info(
                    "placement.placed",
                    model=p.model,
                    replica=p.replica,
                    profile=p.profile,
                    nodes=list(p.nodes),
                )
            for failure in plan.failures:
                p = failure.placement
                log.warning(
                    "replica.failed",
                    model=p.model,
                    replica=p.replica,
                    nodes=list(p.nodes),
                    reason=failure.reason,
                )
            for move in plan.moves:
                # Defragmentation or a spread repair started: the copy is placed now, the
                # moved replica stops once its model is whole without it.
                log.info(
                    "placement.move_started",
                    model=move.placement.model,
                    replica=move.placement.replica,
                    nodes=list(move.placement.nodes),
                    to=move.to,
                    copy=None if move.copy is None else move.copy.replica,
                    reason=move.reason,
                )
            if outcome.outcome_unrecorded is not None:
                log.warning(
                    "placement.outcome_unrecorded",
                    round=self.rounds,
                    recorded_round=outcome.round_id,
                    error=outcome.outcome_unrecorded,
                    detail="the round's plan is written; why its unplaced replicas are "
                    "unplaced is recorded by the next round",
                )
            for rollout in plan.rollouts:
                log.info(
                    "placement.rollout",
                    model=rollout.model,
                    cause=rollout.cause,
                    old=len(rollout.old),
                    new=len(rollout.new),
                    waiting=rollout.waiting,
                )

    def run_forever(self) -> None:
        # The rounds run on the scheduler's own thread; this one only waits to be told to
        # stop. The signal handler notes the signal and returns: stopping the scheduler from
        # inside the handler (as this did) ran on whatever the main thread was doing when
        # the signal came, possibly inside the scheduler holding its executor's lock, and
        # waiting there for the round's thread, which needs that lock to finish: SIGTERM
        # then never returned (a daemon not stopped 30 s after SIGTERM in CI).
        scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=1)}, timezone="UTC"
        )
        scheduler.add_job(
            self.round,
            "interval",
            seconds=self.interval,
            id="placement-round",
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            next_run_time=datetime.now(UTC),
        )
        received: list[str] = []

        def stop(signum: int, _frame: FrameType | None) -> None:
            # Nothing here may take a lock (an event's, the log's): the handler runs on
            # the main thread between two of its bytecodes, maybe while it holds one.
            received.append(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        log.info("placement.started", interval_s=self.interval)
        try:
            scheduler.start()
            # Looked for in short sleeps: a signal the kernel hands to another thread only
            # flags it for this one, which runs its handler when it next wakes.
            while not received:
                time.sleep(0.2)
            log.info("placement.stopping", signal=received[0])
            # Waits for a round in progress to finish, on a thread of its own: this one
            # keeps looking for a second signal, which must not wait for the round.
            stopping = threading.Thread(
                target=scheduler.shutdown, kwargs={"wait": True}, name="placement-stop"
            )
            stopping.start()
            while stopping.is_alive() and len(received) < 2:
                stopping.join(0.2)
            if stopping.is_alive():
                _stop_now(received[1], self.rounds)
        finally:
            self.leadership.release()
            log.info("placement.stopped", rounds=self.rounds)


def _stop_now(signal_name: str, rounds: int) -> NoReturn:
    """End the process with the round in progress cut short (a second signal)."""
    log.warning(
        "placement.stop_forced",
        signal=signal_name,
        rounds=rounds,
        reason="a second signal while the round in progress finished: it is cut short, "
        "its uncommitted writes rolled back by the database",
    )
    # os._exit runs no exit handler and flushes nothing: what was logged is written now.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(128 + signal.Signals[signal_name].value)
