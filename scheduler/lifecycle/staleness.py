"""How long a node may stay silent before the planner stops trusting it.

A node that has not reported recently may still be running its replicas: the
agent may be restarting, or the network between it and the control plane may
be flaky. So silence is graded. A *stale* node receives nothing new but keeps
what it runs; only a node silent for longer than a further grace period is
*lost*, and its replicas are given up and placed elsewhere.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True, slots=True)
class StalenessPolicy:
    """When a silent node becomes stale, when it is lost, and when not to believe it.

    ``mass_loss_fraction`` guards against the control plane's own failures: if
    more than this fraction of the nodes hosting replicas all look lost at
    once, the likelier story is a clock jump or a network partition on our
    side, and wiping the cluster would turn that blip into an outage.

    ``preemption`` is the cluster-wide switch for preemption by model priority
    (``scheduler.planner.preemption``). It lives here, with the rest of the policy a round
    is planned under, because it changes what a round decides: it is recorded
    with every round so that the round can be planned again exactly.
    ``defragment`` is the cluster-wide switch for defragmentation and spread repair
    (``scheduler.planner.defrag``), recorded for the same reason. ``repair_spread``
    repairs every movable model's worsened spread, not only those whose catalog entry
    opts in (``disruption.repair_spread``): the policy way to ask for it.
    """

    stale_after: timedelta = timedelta(seconds=90)
    grace: timedelta = timedelta(minutes=5)
    mass_loss_fraction: float = 0.5
    preemption: bool = True
    defragment: bool = True
    repair_spread: bool = False

    def __post_init__(self) -> None:
        if self.stale_after < timedelta(0) or self.grace < timedelta(0):
            raise ValueError(
                f"staleness policy: stale_after {self.stale_after} and grace "
                f"{self.grace} must not be negative"
            )
        if not 0.0 <= self.mass_loss_fraction <= 1.0:
            raise ValueError(
                f"staleness policy: mass_loss_fraction {self.mass_loss_fraction} "
                "must be between 0 and 1"
            )


DEFAULT_STALENESS = StalenessPolicy()


class Freshness(enum.Enum):
    """How far a node's last report can be trusted."""

    FRESH = "fresh"
    """Reported within ``stale_after``: it may receive new replicas."""
    STALE = "stale"
    """Silent, but within the grace period: it keeps its replicas, gets nothing new."""
    LOST = "lost"
    """Silent beyond the grace period: its replicas are given up."""


def freshness(reported_at: datetime, now: datetime, policy: StalenessPolicy) -> Freshness:
    """Classify a node by the age of its last report.

    A report from the future (agent and control plane clocks disagree) counts as
    fresh: refusing it would empty a healthy node over a clock setting.
    """
    age = now - reported_at
    if age <= policy.stale_after:
        return Freshness.FRESH
    if age <= policy.stale_after + policy.grace:
        return Freshness.STALE
    return Freshness.LOST


def format_age(age: timedelta) -> str:
    """Render a duration the way an operator reads it: ``6m``, ``1m30s``, ``2h5m``."""
    seconds = max(int(age.total_seconds()), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [
        f"{value}{unit}" for value, unit in ((hours, "h"), (minutes, "m"), (seconds, "s")) if value
    ]
    return "".join(parts) or "0s"
