"""Replaying recorded signal windows under a policy, beside what happened. Pure.

Every decision round the daemon ran is recorded (``Tick``: its time, the policy in
force and the model limits it used), and so is every window the gateways sent. A
backtest walks the same ticks, reads the same windows, folds them into the same running
summaries (``autoscale.rolling``, whose figures depend only on which windows are in the
window, not on how they were folded in) and decides with ``rounds.decide_round``: with
the policy that ran, it gives the recorded decisions exactly; with another, what that
policy would have done.

Beside the decisions it counts, per model:

- replica-hours: the wanted count integrated over time from ``since`` to ``until``;
- breached windows: ticks whose window would have missed the SLO (a queue wait p99
  above the model's queue limit in two consecutive windows counts, as it does for the
  decision). What happened is
  read from the recorded p99s; under another policy a tick counts as breached when
  it had no more replicas than really ran and the recorded window breached, or when
  the load per replica it would have had exceeds the replica's capacity (the
  concurrency measured to meet the SLO). A tick with load and no replica counts too.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from autoscale.decide import Decision, Limits, breaches, queue_limit
from autoscale.policy import Policy
from autoscale.rolling import Rolling
from autoscale.rounds import ModelState, decide_round
from autoscale.windows import Summary, Window


@dataclass(frozen=True, slots=True)
class Tick:
    """A recorded decision round: when, under which policy, with which model limits."""

    at: datetime
    policy: Policy
    limits: Mapping[str, Limits]


@dataclass(frozen=True, slots=True)
class Recorded:
    """A recorded decision that changed a model's count."""

    model: str
    at: datetime
    current: int
    wanted: int
    code: str


@dataclass(slots=True)
class Side:
    """One column of the comparison, for one model."""

    decisions: list[tuple[datetime, int, int, str]] = field(default_factory=list)
    replica_seconds: float = 0.0
    breached: int = 0
    ticks: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "decisions": [
                {"at": at.isoformat(), "current": c, "wanted": w, "code": code}
                for at, c, w, code in self.decisions
            ],
            "replica_hours": round(self.replica_seconds / 3600, 4),
            "breached_windows": self.breached,
            "windows": self.ticks,
        }


@dataclass(slots=True)
class Result:
    since: datetime
    until: datetime
    policy: str  # "recorded" or the file's digest
    models: dict[str, tuple[Side, Side]] = field(default_factory=dict)
    # Models whose scaling.min was at least their scaling.max in every round replayed:
    # no policy can change their count (the count they were held at).
    fixed: dict[str, int] = field(default_factory=dict)

    @property
    def same(self) -> bool:
        """Whether the replay made exactly the decisions that were recorded."""
        return all(
            [(a, c, w) for a, c, w, _ in h.decisions] == [(a, c, w) for a, c, w, _ in r.decisions]
            for h, r in self.models.values()
        )

    def totals(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for name, index in (("recorded", 0), ("replayed", 1)):
            sides = [pair[index] for pair in self.models.values()]
            out[name] = {
                "decisions": sum(len(s.decisions) for s in sides),
                "replica_hours": round(sum(s.replica_seconds for s in sides) / 3600, 4),
                "breached_windows": sum(s.breached for s in sides),
            }
        return out


def _estimated_breach(
    summary: Summary | None, limits: Limits, default_capacity: float, replicas: int
) -> bool:
    if summary is None or (summary.requests == 0 and summary.waiting == 0):
        return False
    if replicas <= 0:
        return True
    capacity = limits.capacity or default_capacity
    return summary.load / replicas > capacity


def backtest(
    ticks: Sequence[Tick],
    windows: Sequence[Window],
    *,
    heard: Sequence[datetime],
    recorded: Sequence[Recorded],
    start: Mapping[str, ModelState],
    since: datetime,
    until: datetime,
    policy: Policy | None = None,
    policy_name: str = "recorded",
) -> Result:
    """Replay ``ticks`` in ``since..until`` under ``policy`` (None: the policy each tick ran).

    ``windows`` and ``heard`` (when any gateway reported) must reach back one window
    before ``since``; ``start`` is the state the recorded decisions left at ``since``;
    ``recorded`` the recorded changes within the range.
    """
    result = Result(since, until, policy_name)
    ordered = sorted(windows, key=lambda w: w.received_at)
    times = [w.received_at for w in ordered]
    heard_sorted = sorted(heard)
    replayed: dict[str, ModelState] = dict(start)
    actual: dict[str, ModelState] = dict(start)
    pending = sorted(recorded, key=lambda r: r.at)
    next_recorded = 0
    previous_at = since
    previous_limits: Mapping[str, Limits] = {}
    live = Rolling()
    folded = 0  # windows[:folded] have been folded into ``live``
    held: dict[str, int] = {}  # models with min >= max in every round so far
    movable: set[str] = set()

    def side(model: str) -> tuple[Side, Side]:
        return result.models.setdefault(model, (Side(), Side()))

    def accrue(upto: datetime) -> None:
        seconds = (upto - previous_at).total_seconds()
        if seconds <= 0:
            return
        for model, limit in previous_limits.items():
            happened, replay = side(model)
            happened.replica_seconds += seconds * _count(actual, model, limit)
            replay.replica_seconds += seconds * _count(replayed, model, limit)

    for tick in sorted(ticks, key=lambda t: t.at):
        if not since <= tick.at <= until:
            continue
        accrue(tick.at)
        previous_at, previous_limits = tick.at, tick.limits
        for model, limit in tick.limits.items():
            if limit.max > limit.min:
                movable.add(model)
            else:
                held[model] = limit.min
        in_force = policy or tick.policy
        start_at = tick.at - in_force.window
        lo, hi = bisect.bisect_right(times, start_at), bisect.bisect_right(times, tick.at)
        if live.after is not None and start_at < live.after:
            # A longer window than the last tick's (the policy changed): fold again.
            live, folded = Rolling(), lo
        live.add(ordered[max(folded, lo) : hi])
        live.expire(start_at)
        folded = max(folded, hi)
        h_lo = bisect.bisect_right(heard_sorted, start_at)
        heard_now = bisect.bisect_right(heard_sorted, tick.at) > h_lo
        for decision, summary in decide_round(
            tick.at, in_force, tick.limits, live, heard=heard_now, state=replayed
        ):
            _score(result, decision, summary, tick, policy=in_force, actual=actual)
        # What really happened: the recorded changes up to this tick (its own included,
        # which take effect after it, as the replayed ones do).
        while next_recorded < len(pending) and pending[next_recorded].at <= tick.at:
            r = pending[next_recorded]
            actual[r.model] = ModelState(r.wanted, r.at)
            side(r.model)[0].decisions.append((r.at, r.current, r.wanted, r.code))
            next_recorded += 1
    accrue(until)
    result.fixed = {m: n for m, n in sorted(held.items()) if m not in movable}
    # Recorded changes after the last tick in range (none, when the range ends at a tick).
    for r in pending[next_recorded:]:
        if r.at <= until:
            side(r.model)[0].decisions.append((r.at, r.current, r.wanted, r.code))
    return result


def _count(state: Mapping[str, ModelState], model: str, limit: Limits) -> int:
    found = state.get(model)
    count = limit.min if found is None else found.wanted
    return min(max(count, limit.min), max(limit.max, limit.min))


def _score(
    result: Result,
    decision: Decision,
    summary: Summary | None,
    tick: Tick,
    *,
    policy: Policy,
    actual: Mapping[str, ModelState],
) -> None:
    happened, replay = result.models.setdefault(decision.model, (Side(), Side()))
    if decision.changes:
        replay.decisions.append((decision.at, decision.current, decision.wanted, decision.code))
    limit = tick.limits[decision.model]
    capacity_default = policy.for_model(decision.model).default_capacity
    ran = _count(actual, decision.model, limit)
    queue = queue_limit(limit, policy.for_model(decision.model))
    observed = bool(summary is not None and breaches(summary, limit, queue))
    if summary is not None and summary.requests > 0 and ran == 0:
        observed = True
    happened.ticks += 1
    replay.ticks += 1
    happened.breached += int(observed)
    would = decision.current
    if would == ran:  # the same replicas as ran: what was measured is what it would have had
        breached = observed
    elif would < ran:  # fewer: a breach stays, and the load per replica may now exceed capacity
        breached = observed or _estimated_breach(summary, limit, capacity_default, would)
    else:  # more: a breach is relieved only if the load per replica now fits the capacity
        breached = observed and _estimated_breach(summary, limit, capacity_default, would)
    replay.breached += int(breached)
