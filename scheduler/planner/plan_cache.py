"""A round whose inputs did not change gets the plan it got last time, for the price of a look.

The planner is a pure function (``scheduler.planner.plan``), so two rounds with the
same inputs have the same plan. Between two rounds of a quiet cluster the only
input that changes is the time: every agent reports again and ``now`` moves on.
But the planner reads the time only through a few questions, and in a quiet
cluster the answers do not change either:

- how fresh each node is (fresh, stale, lost): the key holds each node's
  ``Freshness`` at ``now``, not its report time;
- how long a lost node hosting a replica has been silent (the removal's reason
  names it): a round with such a node is not remembered;
- whether a replica missed its startup timeout, and until when a node a replica
  failed on this round is avoided: a round with a replica reported placed,
  starting or failed is not remembered;
- which recorded failures still hold a node back (``Lifecycle.avoided``): the key
  holds, per record, whether it does at ``now``.

Everything else (catalog demands, inventory, placements, policy, lifecycle) is in
the key as it is, compared for equality, not by a digest: a hit is exact, never
a collision. The key refers to the caller's inputs, which, like every value the
planner is given, must not be changed afterwards. Building the key is O(N + C)
for N nodes and C placements with no sorting, a fraction of planning; a
hypothesis test holds a hit to the plan ``plan`` makes
(tests/unit/scheduler/test_plan_memo.py).

Pure: the memo holds values, reads no clock and does no I/O; the caller owns it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from operator import attrgetter
from typing import Any

from scheduler.lifecycle.inputs import Lifecycle
from scheduler.lifecycle.replica_reports import FAILED, PLACED, STARTING
from scheduler.lifecycle.staleness import DEFAULT_STALENESS, StalenessPolicy
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement, Plan
from scheduler.planner.plan import plan

# Every field of a node but its report time, of a placement, and of a replica's
# state (tests check these lists against the dataclasses, so a new field is not
# missed). Read in C by ``attrgetter``: the key of 5,000 nodes and 8,000
# placements is built in a few milliseconds.
NODE_FIELDS = ("name", "gpu_class", "gpus", "memory_gb", "labels", "fabric", "gpus_reserved")
PLACEMENT_FIELDS = (
    "model",
    "replica",
    "profile",
    "nodes",
    "gpus_per_node",
    "gpu_class",
    "memory_gb_per_node",
    "fingerprint",
    "version",
    "moving",
    "moving_for",
)
STATUS_FIELDS = (
    "state",
    "since",
    "placed_at",
    "message",
    "endpoint",
    "reported",
    "effective_context_length",
    "context_detail",
)
_node_fields = attrgetter(*NODE_FIELDS)
_placement_fields = attrgetter(*PLACEMENT_FIELDS)
_status_fields = attrgetter(*STATUS_FIELDS)
# Replica states whose outcome depends on the time itself (a timeout, a back-off's end).
_TIMED_STATES = frozenset({PLACED, STARTING, FAILED})

_FRESH, _STALE, _LOST = 0, 1, 2


def round_key(
    demands: Sequence[Demand],
    nodes: Sequence[Node],
    current: Sequence[Placement],
    now: datetime,
    policy: StalenessPolicy = DEFAULT_STALENESS,
    *,
    lifecycle: Lifecycle | None = None,
) -> tuple[Any, ...] | None:
    """What a round's plan depends on, time reduced to what the planner asks of it.

    Equal keys, equal plans. None when the plan depends on the time in a way the
    key does not hold (see the module), or for inputs ``plan`` refuses.
    """
    if now.tzinfo is None:
        return None
    # age <= stale_after  <=>  reported_at >= now - stale_after (exact in microseconds).
    fresh_from = now - policy.stale_after
    stale_from = fresh_from - policy.grace
    states = [
        _FRESH if at >= fresh_from else _STALE if at >= stale_from else _LOST
        for at in map(attrgetter("reported_at"), nodes)
    ]
    if _LOST in states and _hosts_lost(nodes, states, current):
        return None
    timing: tuple[bool, ...] = ()
    if lifecycle is not None:
        if any(s.reported and s.state in _TIMED_STATES for s in lifecycle.statuses.values()):
            return None
        timing = tuple(now < lifecycle.backoff.until(r) for r in lifecycle.failures)
    return (
        # Demands (frozen dataclasses) compare field by field; their mappings (a
        # selector, fingerprints) by content: the planner never depends on the
        # order of their keys, nor on that of a node's labels.
        tuple(demands),
        tuple(map(_node_fields, nodes)),
        tuple(states),
        tuple(map(_placement_fields, current)),
        policy,
        None if lifecycle is None else _lifecycle_key(lifecycle),
        timing,
    )


def _lifecycle_key(lifecycle: Lifecycle) -> tuple[Any, ...]:
    return (
        tuple(lifecycle.statuses),
        tuple(map(_status_fields, lifecycle.statuses.values())),
        tuple(lifecycle.cordons.items()),
        lifecycle.failures,
        lifecycle.backoff,
        # Engines running where their replica is not placed (``scheduler.planner.readoption``).
        lifecycle.running,
    )


def _hosts_lost(nodes: Sequence[Node], states: list[int], current: Sequence[Placement]) -> bool:
    lost = {n.name for n, s in zip(nodes, states, strict=True) if s == _LOST}
    return any(not lost.isdisjoint(p.nodes) for p in current)


class PlanMemo:
    """``plan`` remembering its last ``size`` rounds: same signature, same plans.

    A caller keeps one and calls it where it called ``plan`` (the daemon now plans from
    what changed: ``scheduler.planner.rounds.incremental``); a round whose key
    (``round_key``) equals a remembered one returns that round's plan (plans are
    immutable, so sharing one is safe).
    """

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self.hits = 0
        self.misses = 0
        self._entries: list[tuple[tuple[Any, ...], Plan]] = []

    def __call__(
        self,
        demands: Sequence[Demand],
        nodes: Sequence[Node],
        current: Sequence[Placement],
        now: datetime,
        policy: StalenessPolicy = DEFAULT_STALENESS,
        *,
        lifecycle: Lifecycle | None = None,
    ) -> Plan:
        key = round_key(demands, nodes, current, now, policy, lifecycle=lifecycle)
        if key is not None:
            for remembered, result in self._entries:
                if remembered == key:
                    self.hits += 1
                    return result
        self.misses += 1
        result = plan(demands, nodes, current, now, policy, lifecycle=lifecycle)
        if key is not None:
            self._entries = [(key, result), *self._entries[: self.size - 1]]
        return result
