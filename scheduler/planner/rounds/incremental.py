"""A round planned from what changed since the last one, at the cost of what changed. Pure.

A round's inputs at 100,000 nodes and 200,000 replicas are large, and between two rounds
of a working fleet almost none of them change: a node's lease is renewed (its report time
moves on, its freshness does not), a few nodes report a change, a replica or two changes
state. A memo of a round's inputs would know a round whose inputs did not change, but only
by building a key of every node and placement, O(N + C) each round (``PlanMemo`` did so
until issue 42). ``IncrementalRounds`` is told what changed (``Changes``) and keeps the
rest from the round before, so a round with nothing changed costs what the changes cost:

- node content: the nodes reported with a change (or new) and the nodes forgotten; a node
  reported again with the same content is no change;
- freshness: every node *not* fresh at ``now``, with its report time (``not_fresh``): what a
  store reads from an index on the leases (``reported_at < now - stale_after``); every
  other node is fresh. Only the nodes not fresh now or at the round before are compared;
- demands, placements, lifecycle, policy: the new value when the caller read a new one
  (None: as at the round before); compared with the round before's in full, only then.

When nothing the planner reads changed, the round's plan is the round before's, under the
same rules as a memo's would be: not when a lost node hosts a replica (its removal
names how long the node was silent), nor when a replica is reported failed, nor once the
clock passes the earliest time a replica reported placed or starting may time out (until
then its start is judged the same; before issue 42's rounds every such replica planned
every round again, which after a node was lost at 100,000 nodes cost seconds a round
until its replacements were ready), and not once the clock crosses the end of a failure's
back-off. Else
the round is planned in full by ``plan`` on the inputs patched with the changes: the same
plan as a full round, which a hypothesis test holds on random fleets and changes
(tests/unit/scheduler/test_incremental_rounds.py).

The nodes a round records (``nodes``) carry, for each fresh node whose last known report
time is older than the freshness boundary, the boundary itself: the store only said it is
fresh, and ``plan`` reads a fresh node's report time only to judge it fresh. Those nodes
planned again give the same plan, so ``explain --round`` replays it. The nodes ``plan`` is
given here are kept from round to round instead (``_given``): a fresh node with a report
time after every boundary (``FRESH``), a node not fresh with its lease, so that only the
nodes whose content or freshness changed are built again, not every fresh node each round
(the boundary moves with every round: at 100,000 nodes a round that plans built 100,000
nodes, and the collector then traversed them). For the same reason they give ``plan`` the
same decisions.

Pure: holds values, reads no clock, does no I/O; the caller owns it, and must not change
the values it gives it afterwards.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any, cast

from scheduler.lifecycle.inputs import DEFAULT_STARTUP_TIMEOUT, Lifecycle
from scheduler.lifecycle.replica_reports import FAILED, PLACED, STARTING
from scheduler.lifecycle.staleness import DEFAULT_STALENESS, StalenessPolicy
from scheduler.planner.fleet.inventory import FRESH, Node, reported_at
from scheduler.planner.fleet.placements import Demand, Placement, Plan
from scheduler.planner.plan import Carried, plan

# Every field of a node but its report time, of a placement, and of a replica's state:
# what the planner reads of them, so what a change is judged by (a test checks these
# lists against the dataclasses, so that a new field is not missed). Read in C by
# ``attrgetter``.
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
_content = attrgetter(*NODE_FIELDS)
_placement_fields = attrgetter(*PLACEMENT_FIELDS)
_status_fields = attrgetter(*STATUS_FIELDS)
_TIMED_STATES = frozenset({PLACED, STARTING})

_FRESH, _STALE, _LOST = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed since the round before, as a store reads it: O(what changed) to build.

    ``not_fresh`` names every node that is not fresh at ``now`` (stale or lost) with its
    report time; any node it does not name is fresh. ``nodes``: nodes new or reported
    with new content (one reported again with the same content may be named too: it is
    compared); ``forgotten``: names no longer in the inventory. ``demands``, ``current``,
    ``lifecycle`` and ``policy``: the new value if one was read, None for as before.
    """

    now: datetime
    not_fresh: Mapping[str, datetime] = field(default_factory=dict)
    nodes: Sequence[Node] = ()
    forgotten: Iterable[str] = ()
    demands: Sequence[Demand] | None = None
    current: Sequence[Placement] | None = None
    lifecycle: Lifecycle | None = None
    policy: StalenessPolicy | None = None


class IncrementalRounds:
    """The round before's inputs and plan, and the next round's plan from its changes.

    ``start`` plans a round from whole inputs (a process's first round, or after the
    store lost track of what changed); ``next`` plans one from its ``Changes``.
    """

    def __init__(self) -> None:
        self.reused = 0
        self.planned = 0
        self._nodes: dict[str, Node] = {}
        self._demands: tuple[Demand, ...] = ()
        self._current: tuple[Placement, ...] = ()
        self._lifecycle = Lifecycle()
        self._policy = DEFAULT_STALENESS
        # The round before: its time, the nodes not fresh then (their state), its plan.
        self._now: datetime | None = None
        self._states: dict[str, int] = {}
        self._plan: Plan | None = None
        self._not_fresh: Mapping[str, datetime] = {}
        # Derived from the inputs when they change, not every round.
        self._hosting: frozenset[str] = frozenset()
        # A replica reported failed (replaced by the round that sees it), and the earliest
        # time a replica reported placed or starting may time out (None: none may).
        self._failed = False
        self._first_timeout: datetime | None = None
        self._backoff_ends: list[datetime] = []
        # The round before's planning work, reused where it provably holds (``Carried``);
        # its ``inventory`` moves with every change to the nodes' content.
        self._carried = Carried(inventory=0)
        # The last ``nodes`` view and what it was made from.
        self._view: tuple[tuple[Any, ...], list[Node]] | None = None
        # The nodes as ``plan`` is given them (``_given_nodes``), in the order of
        # ``_nodes``, and the names whose entry is to be made again (content changed).
        self._given: dict[str, Node] = {}
        self._given_from: Mapping[str, datetime] = {}
        self._dirty: set[str] = set()
        self._regiven = True
        # The fields of the round before's placements and the key of its lifecycle, kept
        # with them (what the next round's are compared with).
        self._current_key: tuple[tuple[Placement, ...], list[tuple[Any, ...]] | None] = ((), [])
        # The placements last given (``Changes.current``), which ``_current`` holds in
        # the same order with the same fields, though perhaps as other objects
        # (``held_for``).
        self._given_current: Sequence[Placement] | None = None
        self._lifecycle_keyed: tuple[Lifecycle, tuple[Any, ...]] | None = None

    @property
    def started(self) -> bool:
        return self._now is not None

    def start(
        self,
        demands: Sequence[Demand],
        nodes: Sequence[Node],
        current: Sequence[Placement],
        now: datetime,
        policy: StalenessPolicy = DEFAULT_STALENESS,
        *,
        lifecycle: Lifecycle | None = None,
    ) -> Plan:
        """Plan a round from whole inputs (``plan``'s signature) and keep them."""
        self._nodes = {}
        self._view = None
        self._given, self._given_from, self._dirty, self._regiven = {}, {}, set(), True
        # Whole inputs: nothing planned before is known to hold for them.
        self._carried = Carried(inventory=0)
        for n in nodes:
            if n.name in self._nodes:
                raise ValueError(
                    f'node "{n.name}" appears twice in the inventory; each node reports once'
                )
            self._nodes[n.name] = n
        fresh_from = now - policy.stale_after
        not_fresh = {n.name: n.reported_at for n in nodes if n.reported_at < fresh_from}
        return self.next(
            Changes(
                now=now,
                not_fresh=not_fresh,
                demands=demands,
                current=current,
                lifecycle=lifecycle or Lifecycle(),
                policy=policy,
            ),
            _whole=True,
        )

    def next(self, changes: Changes, *, _whole: bool = False) -> Plan:
        """The plan of a round whose inputs are the round before's with ``changes``."""
        if changes.now.tzinfo is None:
            raise ValueError(f"now {changes.now} has no time zone; pass the current time in UTC")
        if not _whole and not self.started:
            raise ValueError("no round before: start with whole inputs (IncrementalRounds.start)")
        if not _whole and self._plan is None:
            _whole = True  # the round before was refused: plan this one whatever changed
        changed = _whole | self._take_inventory(changes.nodes, changes.forgotten)
        if changes.policy is not None and changes.policy != self._policy:
            self._policy = changes.policy
            changed = True
        states = self._judge(changes.not_fresh, changes.now)
        if states != self._states:
            changed = True
        timeouts_moved = False
        if changes.demands is not None:
            demands = tuple(changes.demands)
            if demands != self._demands:
                self._demands = demands
                changed = timeouts_moved = True
        if changes.current is not None:
            self._given_current = changes.current
        if changes.current is not None and changes.current is not self._current:
            # The round before's fields are kept with it: compared, not read again.
            fields = list(map(_placement_fields, changes.current))
            if len(fields) != len(self._current) or fields != self._current_fields():
                # The placements the round before's plan wrote, read back (new objects,
                # the same fields): its own objects are taken for them, which the planner
                # cannot tell apart (it reads nothing else of a placement), so that what
                # is carried by identity (each model's resilience) holds for every model
                # whose placements the write did not touch.
                planned = self._plan.placements if self._plan is not None else None
                current = (
                    planned
                    if planned is not None
                    and len(planned) == len(fields)
                    and list(map(_placement_fields, planned)) == fields
                    else tuple(changes.current)
                )
                self._current = current
                self._current_key = (current, fields)
                self._hosting = frozenset(n for p in current for n in p.nodes)
                changed = True
        if changes.lifecycle is not None and changes.lifecycle is not self._lifecycle:
            key = _lifecycle_key(changes.lifecycle)
            if key != self._lifecycle_key():
                self._lifecycle = changes.lifecycle
                self._lifecycle_keyed = (self._lifecycle, key)
                self._failed = any(
                    s.reported and s.state == FAILED for s in self._lifecycle.statuses.values()
                )
                backoff = self._lifecycle.backoff
                self._backoff_ends = sorted(backoff.until(r) for r in self._lifecycle.failures)
                changed = timeouts_moved = True
        if timeouts_moved:
            self._first_timeout = _first_timeout(self._lifecycle, self._demands)
        before, self._now = self._now, changes.now
        self._states = states
        self._not_fresh = changes.not_fresh
        if (
            not changed
            and self._plan is not None
            and not self._failed
            and not self._timeout_reached(before, changes.now)
            and not self._lost_hosting(states)
            and not self._backoff_crossed(before, changes.now)
        ):
            self.reused += 1
            return self._plan
        self.planned += 1
        # Not the round before's plan any more, whatever happens: inputs ``plan`` refuses
        # are refused again next round, not answered with an older plan.
        self._plan = None
        self._plan = plan(
            self._demands,
            self._given_nodes(),
            self._current,
            changes.now,
            self._policy,
            lifecycle=self._lifecycle,
            carried=self._carried,
        )
        return self._plan

    def nodes(self, now: datetime | None = None) -> list[Node]:
        """The nodes with real report times at ``now`` (the last round's time if None): a
        node not fresh with its report time, a fresh one with its own or, if older, the
        freshness boundary; they plan as ``planned_nodes`` do. O(N), built on each call
        with another ``now``: a placer records ``planned_nodes`` instead (each fresh node
        at the boundary, ``record_format.recorded_time``)."""
        at = now or self._now
        if at is None:
            return list(self._nodes.values())
        # Asked again for the same round: the same view, kept.
        key = (at, self._not_fresh, self._carried.inventory, self._policy.stale_after)
        kept = self._view
        if kept is not None and kept[0][1] is key[1] and kept[0] == key:
            return list(kept[1])
        fresh_from = at - self._policy.stale_after
        not_fresh = self._not_fresh
        view = []
        for name, known in self._nodes.items():
            lease = not_fresh.get(name)
            at_most = fresh_from if lease is None else lease
            if (lease is None and known.reported_at >= fresh_from) or known.reported_at == at_most:
                view.append(known)
            else:
                self._nodes[name] = moved = reported_at(known, at_most)
                view.append(moved)
        self._view = (key, view)
        return list(view)

    def held_for(self, read: Sequence[Placement]) -> tuple[Placement, ...] | None:
        """The placements the last round planned from, if ``read`` is the very sequence
        last given as ``Changes.current`` (or to ``start``): the same placements in the
        same order with every field the same, but perhaps other objects (after a write,
        the plan's own; ``next``). A plan keeps these objects, so a caller comparing its
        kept placements with the ones read compares them with these, by identity. None
        for any other sequence: nothing is known of it."""
        return self._current if read is self._given_current else None

    def _current_fields(self) -> list[tuple[Any, ...]]:
        """Every field of each placement of the round before (``PLACEMENT_FIELDS``)."""
        kept = self._current_key
        if kept[0] is not self._current or kept[1] is None:
            kept = self._current_key = (self._current, list(map(_placement_fields, self._current)))
        return cast(list[tuple[Any, ...]], kept[1])

    def _lifecycle_key(self) -> tuple[Any, ...]:
        """``_lifecycle_key`` of the round before's lifecycle, kept with it."""
        kept = self._lifecycle_keyed
        if kept is None or kept[0] is not self._lifecycle:
            kept = self._lifecycle_keyed = (self._lifecycle, _lifecycle_key(self._lifecycle))
        return kept[1]

    def planned_nodes(self) -> list[Node]:
        """The nodes as ``plan`` is given them at the last round's time (``FRESH`` for a
        fresh node's report time): what a round records, each fresh node at the
        freshness boundary (``record_format.recorded_time``). O(what changed since the last
        call) but the list: the nodes are the same objects as long as they do not change."""
        return self._given_nodes()

    def _given_nodes(self) -> list[Node]:
        """The nodes as ``plan`` is given them this round: a node not fresh with its lease
        (``_not_fresh``), a fresh one with ``FRESH`` as its report time; each kept from the
        round before unless its content or freshness changed (O(what changed), and a list;
        O(N) when nodes were added, to keep the order of ``_nodes``)."""
        known, not_fresh, was, dirty = self._nodes, self._not_fresh, self._given_from, self._dirty
        if self._regiven:
            old = self._given
            self._given = given = {}
            for name, n in known.items():
                kept = old.get(name)
                lease = not_fresh.get(name)
                if kept is None or name in dirty or was.get(name) != lease:
                    kept = _fresh_node(n) if lease is None else reported_at(n, lease)
                given[name] = kept
            self._regiven = False
        else:
            given = self._given
            dirty.update(name for name in was if name not in not_fresh)
            dirty.update(name for name, at in not_fresh.items() if was.get(name) != at)
            for name in dirty:
                changed = known.get(name)
                if changed is not None:
                    lease = not_fresh.get(name)
                    given[name] = (
                        _fresh_node(changed) if lease is None else reported_at(changed, lease)
                    )
        self._dirty = set()
        self._given_from = not_fresh
        return list(given.values())

    @property
    def carried(self) -> Carried:
        """The planning work carried from round to round (``plan``'s ``carried``)."""
        return self._carried

    @property
    def node_count(self) -> int:
        return len(self._nodes)

    @property
    def demands(self) -> tuple[Demand, ...]:
        return self._demands

    @property
    def current(self) -> tuple[Placement, ...]:
        return self._current

    @property
    def lifecycle(self) -> Lifecycle:
        return self._lifecycle

    # -- the changes --------------------------------------------------------------------

    def _take_inventory(self, nodes: Sequence[Node], forgotten: Iterable[str]) -> bool:
        changed = False
        for name in forgotten:
            if self._nodes.pop(name, None) is not None:
                self._given.pop(name, None)
                changed = True
        for n in nodes:
            old = self._nodes.get(n.name)
            if old is None or _content(old) != _content(n):
                changed = True
                self._nodes[n.name] = n
                self._dirty.add(n.name)
                self._regiven |= old is None
        if changed:
            self._carried.inventory = cast(int, self._carried.inventory) + 1
        return changed

    def _judge(self, not_fresh: Mapping[str, datetime], now: datetime) -> dict[str, int]:
        """Each node not fresh at ``now``, stale or lost (every other node is fresh)."""
        stale_from = now - self._policy.stale_after - self._policy.grace
        return {
            name: _STALE if at >= stale_from else _LOST
            for name, at in not_fresh.items()
            if name in self._nodes
        }

    def _lost_hosting(self, states: Mapping[str, int]) -> bool:
        return any(s == _LOST and name in self._hosting for name, s in states.items())

    def _timeout_reached(self, before: datetime | None, now: datetime) -> bool:
        """Whether a replica reported placed or starting may have timed out at ``now`` or
        at the round before (``rollout._failure``: ``now - placed_at > timeout``): a round
        that judges one timed out plans again (its failure is dated ``now``), and so does
        every round until its removal is written."""
        first = self._first_timeout
        if first is None:
            return False
        return before is None or max(before, now) > first

    def _backoff_crossed(self, before: datetime | None, now: datetime) -> bool:
        """Whether a failure's back-off ended (or, the clock gone back, began again)
        between the round before and this one: ``now < until`` changed for one of them."""
        if before is None or not self._backoff_ends:
            return before is None
        low, high = (before, now) if before <= now else (now, before)
        ends = self._backoff_ends
        return bisect_right(ends, high) > bisect_right(ends, low)


def _fresh_node(n: Node) -> Node:
    return n if n.reported_at == FRESH else reported_at(n, FRESH)


def _first_timeout(lifecycle: Lifecycle, demands: Sequence[Demand]) -> datetime | None:
    """The earliest time a replica reported placed or starting may time out: its
    ``placed_at`` plus the shortest startup timeout its model's profiles have (the
    default's if shorter; any model's, asked or not: earlier is only a round planned
    again). O(replicas), paid when the lifecycle or the demands change."""
    shortest: dict[str, timedelta] = {}
    for d in demands:
        timeouts = d.lifecycle.startup_timeouts.values() if d.lifecycle is not None else ()
        shortest[d.model] = min((DEFAULT_STARTUP_TIMEOUT, *timeouts))
    first: datetime | None = None
    for (model, _), s in lifecycle.statuses.items():
        if s.reported and s.state in _TIMED_STATES:
            at = s.placed_at + shortest.get(model, DEFAULT_STARTUP_TIMEOUT)
            if first is None or at < first:
                first = at
    return first


def _lifecycle_key(lifecycle: Lifecycle) -> tuple[Any, ...]:
    return (
        tuple(lifecycle.statuses),
        tuple(map(_status_fields, lifecycle.statuses.values())),
        tuple(lifecycle.cordons.items()),
        lifecycle.failures,
        lifecycle.backoff,
        lifecycle.running,
    )
