"""One decision round over every model: the part the daemon and the backtest share. Pure.

The daemon calls ``decide_round`` with what it read from the database; the backtest
calls it with what it read back from the same tables. Same code, same inputs, same
decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from datetime import datetime
from typing import NamedTuple

from autoscale.decide import Decision, Last, Limits, decide, queue_limit
from autoscale.policy import ModelPolicy, Policy
from autoscale.rolling import Rolling
from autoscale.windows import EMPTY, Summary


class ModelState(NamedTuple):
    """What the autoscaler asked for last, and when that count last changed."""

    wanted: int
    changed_at: datetime | None = None


def summary_for(model: str, windows: Rolling, heard: bool) -> Summary | None:
    """The model's summary; EMPTY (idle) when gateways reported but not this model, None
    (unknown) when no gateway reported at all in the window."""
    own = windows.summary(model)
    if own is not None:
        return own
    return EMPTY if heard else None


def judged_summary(
    model: str, windows: Rolling, heard: bool, limit: Limits, policy: ModelPolicy
) -> Summary | None:
    """``summary_for``, with the sustained queue wait taken when the decision needs it:
    only when the window's highest queue wait p99 is above the model's ``queue_limit``
    (at or below it, no two windows can be above it), so a round walks no windows for a
    model whose queue stayed short."""
    summary = summary_for(model, windows, heard)
    if summary is None:
        return None
    top = summary.queue_wait_p99_s
    if top is None or top <= queue_limit(limit, policy):
        return summary
    return summary._replace(queue_wait_sustained_s=windows.sustained_queue_wait(model))


def decide_round(
    at: datetime,
    policy: Policy,
    limits: Mapping[str, Limits],
    windows: Rolling,
    *,
    heard: bool,
    state: MutableMapping[str, ModelState],
) -> list[tuple[Decision, Summary | None]]:
    """Decide for every model with autoscaling on; ``state`` is updated with the changes.

    ``limits`` in catalog order, which is the order decisions are made and recorded;
    ``windows`` holds exactly the windows of the decision's window (``autoscale.rolling``).
    """
    out = []
    for model, limit in limits.items():
        own = policy.for_model(model)
        if not own.enabled:
            # Its state is kept: turned on again, it goes on from its last decision, as a
            # daemon that restarts (and reads its decisions back) would.
            continue
        before = state.get(model)
        current = limit.min if before is None else before.wanted
        last = Last(None if before is None else before.changed_at)
        summary = judged_summary(model, windows, heard, limit, own)
        decision = decide(model, summary, current, limit, own, last=last, now=at)
        if decision.changes:
            # Only changes are state: a model never changed follows scaling.min, whatever
            # it becomes, and a backtest started anywhere knows that from the log alone.
            state[model] = ModelState(decision.wanted, at)
        out.append((decision, summary))
    return out
