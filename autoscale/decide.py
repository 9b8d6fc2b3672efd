"""The decision: how many replicas a model should have now, and why. Pure, no I/O.

``decide(summary, current, limits, policy, last, now) -> Decision``. The same
inputs give the same decision, which is what lets ``llmgw autoscale backtest``
replay recorded windows and reproduce the recorded decisions exactly.

``current`` is the replica count the autoscaler asked for last (``scaling.min``
before its first decision), not what happens to be ready: what is ready depends
on the cluster, which a backtest under another policy cannot know, while what
was asked for it can follow. Whether asked-for replicas have started to take
load is read from the windows themselves (``Summary.replicas``).

The rules, in order (each ends the decision):

1. No gateway reported the model's traffic in the window: hold (nothing is known;
   an idle model is reported with zero requests, a silent one is not idle).
2. A request waits for a model with no replica: ask for one (``max(1, min)``) at
   once, cooldown or not: someone is waiting.
3. Needed = ceil(load / (target x capacity)), at least 1 while any request was
   served. Up when needed exceeds current, or when the SLO was breached in the
   window and every replica asked for is serving (a breach with replicas still
   starting is what those replicas are for). Bounded by ``up_step`` and
   ``scaling.max``; not within ``up_cooldown`` of the last change. A breach is a
   TTFT or TPOT p99 above the ``slo``, or the gateways' queue wait p99 above the
   model's ``slo.ttft_p99`` (or the policy's ``default_queue_wait`` when it has
   none) in two consecutive windows of one gateway (``queue_limit``): a request
   that waits that long in a gateway's queue for a free slot has missed its first
   token's SLO before an engine sees it. Code ``queue_wait`` when that is the
   cause (``load`` when the load alone asks for more, ``slo`` for the others).
4. Down only when needed is below current, the SLO held, nothing waited, and
   ``down_cooldown`` has passed since the last change: to ``max(needed, current -
   down_step, min)``. Needed is computed at the target share, so the remaining
   replicas carry the load at that share of the capacity that meets the SLO.
5. Otherwise hold.

Up at load > current x target x capacity, down at load <= (current - 1) x target x
capacity: the gap between the two is what keeps it from flapping.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from autoscale.policy import ModelPolicy
from autoscale.windows import Summary

# The stable code of a scale-up for the gateways' queue wait (rule 3).
QUEUE_WAIT = "queue_wait"
UP = "up"
DOWN = "down"
HOLD = "hold"
ACTIONS = (UP, DOWN, HOLD)


@dataclass(frozen=True, slots=True)
class Limits:
    """What the catalog and the bench say of a model, as a decision needs it.

    ``ttft_p99_s`` / ``tpot_p99_s``: the SLO (None: none declared). ``capacity``:
    concurrent requests one replica carries within the SLO, from ``llmgw bench
    --record`` (``capacity_source`` "bench") or the policy's default ("default").
    """

    min: int
    max: int
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    capacity: float | None = None
    capacity_source: str = "default"

    def to_json(self) -> dict[str, Any]:
        return {
            "min": self.min,
            "max": self.max,
            "ttft_p99_s": self.ttft_p99_s,
            "tpot_p99_s": self.tpot_p99_s,
            "capacity": self.capacity,
            "capacity_source": self.capacity_source,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Limits:
        return cls(
            min=int(data["min"]),
            max=int(data["max"]),
            ttft_p99_s=data.get("ttft_p99_s"),
            tpot_p99_s=data.get("tpot_p99_s"),
            capacity=data.get("capacity"),
            capacity_source=str(data.get("capacity_source", "default")),
        )


class Last(NamedTuple):
    """The autoscaler's previous decisions for a model: when it last changed the count."""

    changed_at: datetime | None = None


class Decision(NamedTuple):
    """One model's decision. A named tuple, as ``Summary``: a round makes one per model,
    and a frozen dataclass costs several times as much to make."""

    model: str
    at: datetime
    current: int
    wanted: int
    action: str
    # A stable word for alerts and filters (load, slo, queue_wait, waiting, idle,
    # cooldown, at_max, bounds, no_signal, steady, starting) and the sentence people read.
    code: str
    reason: str
    needed: int
    capacity: float
    breaches: tuple[str, ...] = ()

    @property
    def changes(self) -> bool:
        return self.wanted != self.current


def queue_limit(limits: Limits, policy: ModelPolicy) -> float:
    """The queue wait p99 (seconds) above which the model scales up: its
    ``slo.ttft_p99``, else the policy's ``default_queue_wait``."""
    return limits.ttft_p99_s or policy.default_queue_wait.total_seconds()


def queue_over(summary: Summary, limit: float | None) -> bool:
    """Whether two consecutive windows of one gateway both had a queue wait p99 above
    ``limit`` (None: the queue is not judged)."""
    held = summary.queue_wait_sustained_s
    return limit is not None and held is not None and held > limit


def breaches(summary: Summary, limits: Limits, queue: float | None = None) -> tuple[str, ...]:
    """Each SLO target the window's p99 exceeded, said with both numbers; and the queue
    wait when ``queue`` (``queue_limit``) is given and two consecutive windows exceeded it."""
    ttft, tpot = summary.ttft_p99_s, summary.tpot_p99_s
    ttft_slo, tpot_slo = limits.ttft_p99_s, limits.tpot_p99_s
    ttft_over = bool(ttft_slo and ttft is not None and ttft > ttft_slo)
    tpot_over = bool(tpot_slo and tpot is not None and tpot > tpot_slo)
    queued = queue_over(summary, queue)
    if not (ttft_over or tpot_over or queued):
        return ()
    out = []
    if queued:
        out.append(
            f"queue wait p99 {summary.queue_wait_sustained_s:.3f}s > {queue:g}s in two "
            "consecutive windows"
        )
    if ttft_over:
        out.append(f"ttft p99 {ttft:.3f}s > {ttft_slo:g}s")
    if tpot_over:
        out.append(f"tpot p99 {tpot:.3f}s > {tpot_slo:g}s")
    return tuple(out)


def needed_replicas(summary: Summary, capacity: float, target: float) -> int:
    """Replicas that carry ``summary.load`` at ``target`` x ``capacity`` each."""
    per = capacity * target
    needed = math.ceil(round(summary.load / per, 9)) if summary.load > 0 else 0
    if summary.requests > 0 or summary.waiting > 0:
        needed = max(needed, 1)
    return needed


def _per(summary: Summary, base: int, capacity: float) -> str:
    # Said only where a reason needs it: formatting is much of a round's cost.
    return f"load {summary.load:.2f} over {max(base, 1)} replica(s) at capacity {capacity:g}"


def _since(last: Last, now: datetime) -> timedelta | None:
    return None if last.changed_at is None else now - last.changed_at


def decide(
    model: str,
    summary: Summary | None,
    current: int,
    limits: Limits,
    policy: ModelPolicy,
    *,
    last: Last,
    now: datetime,
) -> Decision:
    """The model's wanted replicas now, within ``limits.min..limits.max``, and why."""
    lo = max(limits.min, 0)
    hi = max(limits.max, lo)
    base = min(max(current, lo), hi)
    capacity = limits.capacity if limits.capacity else policy.default_capacity

    def out(
        wanted: int, code: str, reason: str, needed: int = base, why: tuple[str, ...] = ()
    ) -> Decision:
        action = UP if wanted > current else DOWN if wanted < current else HOLD
        return Decision(model, now, current, wanted, action, code, reason, needed, capacity, why)

    if base != current:
        # The catalog's scaling bounds moved under the count asked for: follow them first.
        edge = "scaling.min" if base == lo and current < lo else "scaling.max"
        return out(base, "bounds", f"{edge} is now {base}: {current} -> {base}")
    if summary is None:
        return out(base, "no_signal", f"no gateway reported {model} in the window: holding {base}")
    if summary.waiting > 0 and base == 0:
        wanted = min(max(1, lo), hi) if hi > 0 else 0
        if wanted == 0:
            return out(0, "at_max", f"{summary.waiting} request(s) wait but scaling.max is 0")
        return out(
            wanted, "waiting", f"{summary.waiting} request(s) wait with no replica: asking for 1", 1
        )
    needed = needed_replicas(summary, capacity, policy.target)
    queue = queue_limit(limits, policy)
    why = breaches(summary, limits, queue)

    since = _since(last, now)
    up_target = needed
    starting = base > 0 and summary.replicas < base
    if why and not starting and base > 0:
        up_target = max(up_target, base + 1)
    if up_target > base:
        cause = (
            "load"
            if not why or needed > base
            else QUEUE_WAIT
            if queue_over(summary, queue)
            else "slo"
        )
        if base >= hi:
            return out(
                base,
                "at_max",
                f"wants {up_target} ({_per(summary, base, capacity)}) but scaling.max is {hi}",
                needed,
                why,
            )
        if since is not None and since < policy.up_cooldown:
            left = (policy.up_cooldown - since).total_seconds()
            return out(
                base,
                "cooldown",
                f"wants {up_target} ({cause}) but the last change was {since.total_seconds():.0f}s "
                f"ago (up_cooldown {policy.up_cooldown.total_seconds():g}s, {left:.0f}s left)",
                needed,
                why,
            )
        wanted = min(up_target, base + policy.up_step, hi)
        said = (
            f"{_per(summary, base, capacity)} > target {policy.target:g}"
            if cause == "load"
            else "; ".join(why)
        )
        return out(wanted, cause, f"up {base} -> {wanted}: {said}", needed, why)
    if why and starting:
        return out(
            base,
            "starting",
            f"SLO breached ({'; '.join(why)}) while {base - summary.replicas} asked-for "
            "replica(s) have not served yet: waiting for them",
            needed,
            why,
        )
    if needed < base and not why and summary.waiting == 0:
        floor = max(needed, base - policy.down_step, lo)
        if floor >= base:
            return out(base, "steady", f"at scaling.min {lo}", needed)
        if since is not None and since < policy.down_cooldown:
            left = (policy.down_cooldown - since).total_seconds()
            return out(
                base,
                "cooldown",
                f"could go down to {floor} but the last change was {since.total_seconds():.0f}s "
                f"ago (down_cooldown {policy.down_cooldown.total_seconds():g}s, {left:.0f}s left)",
                needed,
            )
        if summary.requests == 0:
            return out(floor, "idle", f"down {base} -> {floor}: no requests in the window", needed)
        return out(
            floor,
            "load",
            f"down {base} -> {floor}: {_per(summary, base, capacity)}; {needed} carry it "
            f"at target {policy.target:g}",
            needed,
        )
    return out(base, "steady", f"holding {base}: {_per(summary, base, capacity)}", needed)
