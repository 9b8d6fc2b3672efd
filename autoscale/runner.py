"""The autoscaler in the scheduler's daemon: one decision round per interval, as leader only.

The daemon calls ``Autoscaler.tick(now)`` before each placement round, and only while
it leads (``scheduler.daemon.loop``). A tick runs a round when the interval has passed, or
at once when a gateway reported a request waiting for a model that has no replica
(scale from zero must not wait out an interval). A round reads the windows, decides
for every model (``autoscale.rounds``) and writes, in one transaction, the round
(its time, policy and limits, so a backtest walks the same rounds) and one event per
decision that changes a count, plus the holds worth knowing about (at ``scaling.max``
with the SLO breached, waiting for replicas to start, no signal, an increase held by
its cooldown): those once per episode, not every round.

State is read back from the recorded decisions at every round, never kept only in
memory: a daemon that takes over leadership goes on from the last decision any
leader made.

Each round is decided "as of" ``now - SETTLE``: a window the server stamped just
before that instant has committed by the time it is read, so the live round and a
later backtest read the same windows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog
from sqlalchemy import Connection

from autoscale.decide import HOLD, Decision, Limits
from autoscale.limits import model_limits
from autoscale.policy import Policy
from autoscale.rolling import Rolling
from autoscale.rounds import decide_round
from autoscale.store import DECISION, AutoscaleStore, digest_of
from autoscale.store import HOLD as HOLD_EVENT
from autoscale.windows import Summary
from catalog import Model

log = structlog.get_logger("llmgw.autoscale")

SETTLE = timedelta(seconds=1)
# Windows, reports and rounds are pruned at most this often.
PRUNE_EVERY = timedelta(minutes=10)
# Holds recorded as events (once per episode): each needs a person or explains a delay.
NOTABLE_HOLDS = frozenset({"at_max", "starting", "no_signal"})


class Recent:
    """The windows of the decision window, kept between rounds and folded into running
    summaries (``autoscale.rolling``): each round reads only those received since the
    last (``(last, at]``), which is exactly the set a full read would add, since every
    window received by ``last`` had committed when it was read (``SETTLE``), and folds out
    those that left. A round after a gap (or the first) reads the whole window again.
    Either way the summaries are those of the same set, to the bit."""

    def __init__(self) -> None:
        self.upto: datetime | None = None
        self.rolling = Rolling()

    def windows(self, store: AutoscaleStore, after: datetime, at: datetime) -> Rolling:
        if self.upto is None or self.upto < after or self.upto > at:
            self.rolling = Rolling.of(store.windows(after, at))
            self.rolling.expire(after)
        else:
            self.rolling.add(store.windows(self.upto, at))
            self.rolling.expire(after)
        self.upto = at
        return self.rolling


def decision_body(
    decision: Decision, summary: Summary | None, limits: Limits, policy: Policy
) -> dict[str, Any]:
    """A decision as recorded: what it did, why, and every input it was decided from."""
    return {
        "current": decision.current,
        "wanted": decision.wanted,
        "action": decision.action,
        "code": decision.code,
        "reason": decision.reason,
        "needed": decision.needed,
        "capacity": decision.capacity,
        "breaches": list(decision.breaches),
        "inputs": {
            "at": decision.at.isoformat(),
            "summary": None if summary is None else summary.to_json(),
            "limits": limits.to_json(),
            "policy": policy.for_model(decision.model).to_json(),
            "window": policy.to_json()["window"],
        },
    }


@dataclass
class RoundReport:
    at: datetime
    decisions: list[tuple[Decision, Summary | None]] = field(default_factory=list)
    duration_ms: float = 0.0

    @property
    def changes(self) -> list[Decision]:
        return [d for d, _ in self.decisions if d.changes]


class Autoscaler:
    def __init__(
        self,
        store: AutoscaleStore,
        models: Callable[[], tuple[Sequence[Model], int]],
        policy: Policy,
    ) -> None:
        """``models`` answers the catalog's models in order and its position."""
        self.store = store
        self.models = models
        self.policy = policy
        self.last_at: datetime | None = None
        self._waiting_checked: datetime | None = None
        self._holds: dict[str, str] = {}
        self._limits: tuple[tuple[int, int], dict[str, Limits], tuple[str, str]] | None = None
        self._pruned: datetime | None = None
        self._recent = Recent()

    def limits(self) -> tuple[dict[str, Limits], tuple[str, str]]:
        """Every model's limits and their digest, recomputed only when the catalog or a
        measured capacity changed."""
        models, position = self.models()
        key = (position, self.store.capacity_position())
        if self._limits is None or self._limits[0] != key:
            limits = model_limits(models, self.store.capacities())
            digest = digest_of({m: lim.to_json() for m, lim in limits.items()})
            self._limits = (key, limits, digest)
        return self._limits[1], self._limits[2]

    def due(self, now: datetime) -> bool:
        at = now - SETTLE
        if self.last_at is None or at >= self.last_at + self.policy.interval:
            return True
        checked, self._waiting_checked = self._waiting_checked or self.last_at, at
        waiting = self.store.waiting_since(checked)
        if not waiting:
            return False
        limits, _ = self.limits()
        state = self.store.state()
        return any(
            model in limits
            and self.policy.for_model(model).enabled
            and (state[model].wanted if model in state else limits[model].min) == 0
            for model in waiting
        )

    def tick(
        self, now: datetime, fence: Callable[[Connection], None] | None = None
    ) -> RoundReport | None:
        """A round if one is due (see the module), else None. ``fence`` is called first in
        the round's transaction and raises to refuse it (the scheduler's leadership lease)."""
        if not self.policy.enabled or not self.due(now):
            return None
        return self.run(now - SETTLE, fence)

    def run(self, at: datetime, fence: Callable[[Connection], None] | None = None) -> RoundReport:
        started = time.perf_counter()
        policy = self.policy
        limits, digest = self.limits()
        windows = self._recent.windows(self.store, at - policy.window, at)
        heard = bool(self.store.heard(at - policy.window, at))
        state = self.store.state()
        report = RoundReport(at)
        report.decisions = decide_round(at, policy, limits, windows, heard=heard, state=state)
        with self.store.engine.begin() as conn:
            if fence is not None:
                fence(conn)
            self.store.record_round(
                conn, at, policy, limits, changes=len(report.changes), limits_digest=digest
            )
            for decision, summary in report.decisions:
                body = decision_body(decision, summary, limits[decision.model], policy)
                if decision.changes:
                    self._holds.pop(decision.model, None)
                    self.store.append(conn, DECISION, decision.model, body, at=at)
                elif self._notable(decision):
                    self._holds[decision.model] = decision.code
                    self.store.append(conn, HOLD_EVENT, decision.model, body, at=at)
                    log.info(
                        "autoscale.hold",
                        model=decision.model,
                        current=decision.current,
                        code=decision.code,
                        reason=decision.reason,
                    )
                elif decision.action == HOLD and decision.code == "steady":
                    self._holds.pop(decision.model, None)
        self.last_at = at
        self._waiting_checked = at
        report.duration_ms = (time.perf_counter() - started) * 1000
        self._log(report)
        if self._pruned is None or at - self._pruned >= PRUNE_EVERY:
            self._pruned = at
            gone = self.store.prune(at - policy.retention)
            if gone:
                log.info("autoscale.pruned", rows=gone, before=(at - policy.retention).isoformat())
        return report

    def _notable(self, decision: Decision) -> bool:
        notable = decision.code in NOTABLE_HOLDS or (
            decision.code == "cooldown" and decision.needed > decision.current
        )
        return notable and self._holds.get(decision.model) != decision.code

    def _log(self, report: RoundReport) -> None:
        for decision, summary in report.decisions:
            if not decision.changes:
                continue
            fields: Mapping[str, Any] = {} if summary is None else summary.to_json()
            log.info(
                "autoscale.decision",
                model=decision.model,
                current=decision.current,
                wanted=decision.wanted,
                action=decision.action,
                code=decision.code,
                reason=decision.reason,
                load=fields.get("load"),
                ttft_p99_s=fields.get("ttft_p99_s"),
                tpot_p99_s=fields.get("tpot_p99_s"),
                waiting=fields.get("waiting"),
            )
        log.info(
            "autoscale.round",
            at=report.at.isoformat(),
            models=len(report.decisions),
            changes=len(report.changes),
            duration_ms=round(report.duration_ms, 2),
        )


def wanted_counts(
    store: AutoscaleStore, policy: Policy, at: datetime | None = None
) -> dict[str, int]:
    """What the autoscaler asks placement for, per model it scales (at ``at``, or now).

    Models opted out, or every model when autoscaling is off, are left out: placement
    then asks for ``scaling.min`` as before.
    """
    if not policy.enabled:
        return {}
    return {
        model: s.wanted for model, s in store.state(at).items() if policy.for_model(model).enabled
    }
