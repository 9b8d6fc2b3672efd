"""Defragmentation and spread repair as steps of the round (``plan.plan``), round after round.

Each test drives the pure planner as the daemon does: the plan's placements are the next
round's current placements, and a replica placed in one round reports ready by the next
(``Cluster``). The properties hold what issue 29 asks of every plan: no node overcommitted,
no higher-priority replica lost, and the same inputs giving the same moves.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.definition.views import PlacementProfile
from scheduler.lifecycle.inputs import Lifecycle, ModelLifecycle
from scheduler.lifecycle.replica_reports import READY, STARTING, ReplicaStatus
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement, Plan
from scheduler.planner.plan import plan
from tests.unit.scheduler.placement_builders import NOW, node, overcommitted, profile

ONE = profile("t4", "T4", 1)
EIGHT = profile("t4x8", "T4", 8)


def _spec(
    minimum: int,
    *profiles: PlacementProfile,
    movable: bool = True,
    max_moving: int | str | None = None,
    repair_spread: bool = False,
) -> ModelLifecycle:
    return ModelLifecycle(
        fingerprints={p.name: f"{p.name}/v1" for p in profiles},
        version="v1",
        min_ready=minimum,
        movable=movable,
        max_moving=max_moving,
        repair_spread=repair_spread,
    )


def small(
    replicas: int = 56, *, movable: bool = True, max_moving: int | str | None = None
) -> Demand:
    return Demand(
        "small",
        replicas,
        (ONE,),
        lifecycle=_spec(replicas, ONE, movable=movable, max_moving=max_moving),
    )


def big() -> Demand:
    return Demand("big", 1, (EIGHT,), lifecycle=_spec(1, EIGHT))


@dataclass
class Cluster:
    """The daemon's loop without I/O: plan, apply, and replicas report ready a round later."""

    nodes: list[Node]
    policy: StalenessPolicy = field(default_factory=StalenessPolicy)
    current: list[Placement] = field(default_factory=list)
    statuses: dict[tuple[str, int], ReplicaStatus] = field(default_factory=dict)
    rounds: int = 0

    def round(self, demands: list[Demand]) -> Plan:
        self.rounds += 1
        now = NOW + timedelta(seconds=10 * self.rounds)
        nodes = [replace(n, reported_at=now) for n in self.nodes]
        # What was placed last round is ready now (its agent said so between rounds).
        for key, s in list(self.statuses.items()):
            if s.state == STARTING:
                self.statuses[key] = ReplicaStatus(READY, now, s.placed_at, reported=True)
        result = plan(
            demands, nodes, self.current, now, self.policy, lifecycle=Lifecycle(self.statuses)
        )
        self.current = list(result.placements)
        for r in result.remove:
            self.statuses.pop((r.placement.model, r.placement.replica), None)
        for p in result.place:
            self.statuses[p.model, p.replica] = ReplicaStatus(STARTING, now, now, reported=True)
        return result

    def ready(self, model: str) -> int:
        return sum(
            1
            for p in self.current
            if p.model == model and self.statuses[p.model, p.replica].state == READY
        )


def fragmented(**budget: Any) -> Cluster:
    """8 nodes of 8 T4 cards, 56 one-card replicas spread 7 a node, all ready."""
    cluster = Cluster([node(f"n{i}", "T4", 8) for i in range(8)])
    cluster.round([small(**budget)])
    cluster.round([small(**budget)])
    assert Counter(p.nodes[0] for p in cluster.current) == {f"n{i}": 7 for i in range(8)}
    assert cluster.ready("small") == 56
    return cluster


def test_the_tp8_replica_is_placed_by_seven_surge_first_moves() -> None:
    cluster = fragmented()
    first = cluster.round([small(), big()])
    # The fewest moves: the seven replicas of one node, each to another node.
    assert len(first.moves) == 7
    (cleared,) = {m.placement.nodes[0] for m in first.moves}
    assert {m.to for m in first.moves} == {f"n{i}" for i in range(8)} - {cleared}
    assert all(
        m.reason == f"to make room for model big, profile t4x8 on node {cleared}"
        for m in first.moves
    )
    # Surge-first: the copies are placed, nothing is removed yet.
    assert not first.remove
    assert sorted(p.replica for p in first.place) == list(range(56, 63))
    assert len(first.moving) == 7
    (waiting,) = first.unplaced
    assert waiting.reason.endswith(f"moving 7 replica(s) to make room on node {cleared}")
    assert cluster.ready("small") == 56
    second = cluster.round([small(), big()])
    # The copies reported ready: the old ones stop, and the room they leave is big's.
    assert len(second.remove) == 7
    assert all(r.reason.startswith("to make room for model big") for r in second.remove)
    assert [(p.model, p.nodes) for p in second.place] == [("big", (cleared,))]
    assert not second.unplaced and not second.moving
    assert cluster.ready("small") == 56
    assert overcommitted(cluster.current, cluster.nodes) == []
    # Nothing more to do: a third round changes nothing.
    assert not cluster.round([small(), big()]).changes_anything


def test_no_moved_model_is_ever_below_its_min_ready_while_copies_start_slowly() -> None:
    cluster = fragmented()
    cluster.round([small(), big()])
    # The copies stay starting for a while (their statuses are not advanced): nothing old
    # may stop meanwhile, and no other move starts.
    for minutes in (1, 2, 3):
        now = NOW + timedelta(minutes=minutes)
        result = plan(
            [small(), big()],
            [replace(n, reported_at=now) for n in cluster.nodes],
            cluster.current,
            now,
            lifecycle=Lifecycle(cluster.statuses),
        )
        assert not result.remove
        assert not result.moves
        assert len(result.moving) == 7
    assert cluster.ready("small") == 56


def test_a_model_whose_budget_forbids_moves_is_never_moved_and_the_reason_names_it() -> None:
    cases: tuple[tuple[dict[str, Any], str], ...] = (
        ({"movable": False}, "small (disruption.movable is false)"),
        ({"max_moving": 0}, "small (disruption.max_unavailable 0 allows 0 in motion)"),
    )
    for budget, said in cases:
        cluster = fragmented(**budget)
        for _ in range(3):
            result = cluster.round([small(**budget), big()])
            assert not result.moves and not result.moving and not result.remove
            (unplaced,) = result.unplaced
            assert f"the disruption budget of {said} stood in the way" in unplaced.reason


def test_a_percentage_budget_caps_the_moves_and_says_so() -> None:
    # 10% of 56 is 5 in motion at once: 7 are needed on any node.
    cluster = fragmented(max_moving="10%")
    result = cluster.round([small(max_moving="10%"), big()])
    assert not result.moves
    (unplaced,) = result.unplaced
    assert "disruption.max_unavailable '10%' allows 5 in motion" in unplaced.reason


def test_the_switch_turns_defragmentation_off() -> None:
    cluster = fragmented()
    cluster.policy = StalenessPolicy(defragment=False)
    result = cluster.round([small(), big()])
    assert not result.moves and not result.place
    (unplaced,) = result.unplaced
    assert "defrag" not in unplaced.reason


def test_a_higher_priority_model_is_not_moved_for_a_lower_one() -> None:
    cluster = fragmented()
    ranked = replace(small(), priority=5)
    cluster.round([ranked])
    result = cluster.round([ranked, big()])
    assert not result.moves
    assert len(result.unplaced) == 1


def test_a_worsened_spread_is_repaired_when_the_node_returns_one_move_at_a_time() -> None:
    pair = Demand("pair", 2, (ONE,), lifecycle=_spec(2, ONE, repair_spread=True))
    plain = Demand("plain", 2, (ONE,), lifecycle=_spec(2, ONE))
    cluster = Cluster([node("a", "T4", 4), node("b", "T4", 4)])
    cluster.round([pair, plain])
    cluster.round([pair, plain])
    assert {p.nodes for p in cluster.current if p.model == "pair"} == {("a",), ("b",)}
    # b is lost: every replica there is placed again on a.
    gone = cluster.nodes
    cluster.nodes = [gone[0]]
    cluster.round([pair, plain])
    cluster.round([pair, plain])
    assert {p.nodes for p in cluster.current} == {("a",)}
    # b comes back: pair (opted in) is repaired by one surge-first move; plain is not.
    cluster.nodes = gone
    repaired = cluster.round([pair, plain])
    (move,) = repaired.moves
    assert move.placement.model == "pair" and move.to == "b"
    assert move.reason == "to repair the spread of model pair: 2 of its replicas share node a"
    assert not repaired.remove
    assert cluster.ready("pair") == 2
    done = cluster.round([pair, plain])
    (removed,) = done.remove
    assert removed.placement == replace(move.placement, moving="", moving_for="") or (
        removed.placement.replica == move.placement.replica
    )
    assert cluster.ready("pair") == 2
    assert {p.nodes for p in cluster.current if p.model == "pair"} == {("a",), ("b",)}
    assert {p.nodes for p in cluster.current if p.model == "plain"} == {("a",)}
    assert not cluster.round([pair, plain]).changes_anything


def _lost_and_returned(cluster: Cluster, demands: list[Demand]) -> None:
    """Two rounds on both nodes, b lost for two rounds, then b back (not yet planned)."""
    cluster.round(demands)
    cluster.round(demands)
    both = cluster.nodes
    cluster.nodes = [both[0]]
    cluster.round(demands)
    cluster.round(demands)
    assert {p.nodes for p in cluster.current} == {("a",)}
    cluster.nodes = both


def test_the_cluster_policy_repairs_every_movable_models_spread_but_not_an_unmovable_one() -> None:
    # [scheduler] repair_spread = true: no model opted in, each is repaired in turn, one
    # move at a time; a model with movable: false is never moved.
    first = Demand("first", 2, (ONE,), lifecycle=_spec(2, ONE))
    second = Demand("second", 2, (ONE,), lifecycle=_spec(2, ONE))
    pinned = Demand("pinned", 2, (ONE,), lifecycle=_spec(2, ONE, movable=False))
    demands = [first, second, pinned]
    cluster = Cluster(
        [node("a", "T4", 6), node("b", "T4", 6)], policy=StalenessPolicy(repair_spread=True)
    )
    _lost_and_returned(cluster, demands)
    moved: list[str] = []
    for _ in range(8):
        result = cluster.round(demands)
        assert len(result.moves) <= 1
        moved += [m.placement.model for m in result.moves]
        assert all(cluster.ready(d.model) == 2 for d in demands)
    assert moved == ["first", "second"]
    for model in ("first", "second"):
        assert {p.nodes for p in cluster.current if p.model == model} == {("a",), ("b",)}
    assert {p.nodes for p in cluster.current if p.model == "pinned"} == {("a",)}
    # Without the policy (the default), the same history repairs nothing.
    off = Cluster([node("a", "T4", 6), node("b", "T4", 6)])
    _lost_and_returned(off, demands)
    assert not any(off.round(demands).moves for _ in range(4))


GANG = profile("t4x8x2", "T4", 8, nodes=2)


def gang() -> Demand:
    return Demand("gang", 1, (GANG,), lifecycle=_spec(1, GANG))


def fragmented_fabric(**budget: Any) -> Cluster:
    """8 nodes of 8 T4 cards on one fabric, 32 one-card replicas spread 4 a node, all ready:
    32 cards free, 4 on each node, and a 2 x 8-card gang fits on none."""
    cluster = Cluster([node(f"n{i}", "T4", 8, fabric="f") for i in range(8)])
    cluster.round([small(32, **budget)])
    cluster.round([small(32, **budget)])
    assert Counter(p.nodes[0] for p in cluster.current) == {f"n{i}": 4 for i in range(8)}
    assert cluster.ready("small") == 32
    return cluster


def test_a_two_node_gang_is_placed_by_surge_first_moves_that_clear_two_nodes() -> None:
    cluster = fragmented_fabric()
    first = cluster.round([small(32), gang()])
    # The fewest moves: the four replicas of each of two nodes, none onto either of them.
    assert len(first.moves) == 8
    cleared = {m.placement.nodes[0] for m in first.moves}
    assert len(cleared) == 2
    assert not {m.to for m in first.moves} & cleared
    for m in first.moves:
        assert m.reason == (
            f"to make room for model gang, profile t4x8x2 on node {m.placement.nodes[0]}"
        )
    assert not first.remove
    assert len(first.moving) == 8
    (waiting,) = first.unplaced
    assert waiting.reason.endswith(
        "moving 8 replica(s) to make room on nodes " + ", ".join(sorted(cleared))
    )
    assert overcommitted(cluster.current, cluster.nodes) == []
    assert cluster.ready("small") == 32
    second = cluster.round([small(32), gang()])
    assert len(second.remove) == 8
    assert [(p.model, set(p.nodes)) for p in second.place] == [("gang", cleared)]
    assert not second.unplaced and not second.moving
    # Never below its min ready (32): the copies were ready before the old ones stopped.
    assert cluster.ready("small") == 32
    assert overcommitted(cluster.current, cluster.nodes) == []
    assert not cluster.round([small(32), gang()]).changes_anything


def test_a_budget_that_forbids_clearing_two_nodes_is_named_and_nothing_moves() -> None:
    # 3 in motion at once; 8 moves are needed (4 on each of two nodes).
    cluster = fragmented_fabric(max_moving=3)
    for _ in range(3):
        result = cluster.round([small(32, max_moving=3), gang()])
        assert not result.moves and not result.moving and not result.remove
        (unplaced,) = result.unplaced
        assert "not defragmented: profile t4x8x2: no 2 nodes of one fabric" in unplaced.reason
        assert (
            "the disruption budget of small (disruption.max_unavailable 3 allows 3 in motion)"
            " stood in the way" in unplaced.reason
        )
    assert cluster.ready("small") == 32


# -- properties ---------------------------------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Demand], list[Node], list[Placement]]:
    """A cluster already running spread replicas, and a new model or two to fit in (some of
    them gangs of two nodes)."""
    sizes = draw(st.lists(st.sampled_from([2, 4, 8]), min_size=2, max_size=7))
    # Fabrics for the gangs among the new demands (a node without one is in no gang).
    fabrics = draw(st.lists(st.sampled_from(["f0", "f1", None]), min_size=7, max_size=7))
    nodes = [node(f"n{i}", "T4", g, fabric=fabrics[i]) for i, g in enumerate(sizes)]
    running = []
    for i in range(draw(st.integers(1, 3))):
        gpus = draw(st.sampled_from([1, 1, 2]))
        replicas = draw(st.integers(1, 2 * len(nodes)))
        p = profile(f"p{gpus}", "T4", gpus)
        running.append(
            Demand(
                f"m{i}",
                replicas,
                (p,),
                lifecycle=_spec(
                    draw(st.integers(0, replicas)),
                    p,
                    movable=draw(st.booleans()) or True,
                    max_moving=draw(st.sampled_from([None, None, 0, 1, 2, "50%"])),
                ),
                priority=draw(st.sampled_from([0, 0, 1, 5])),
            )
        )
    before = list(plan(running, nodes, (), NOW).placements)
    new = []
    for j in range(draw(st.integers(1, 2))):
        gpus = draw(st.sampled_from([2, 4, 8]))
        span = draw(st.sampled_from([1, 1, 2]))
        p = profile(f"q{gpus}x{span}", "T4", gpus, nodes=span)
        new.append(
            Demand(
                f"new{j}",
                draw(st.integers(1, 2)),
                (p,),
                lifecycle=_spec(1, p),
                priority=draw(st.sampled_from([0, 1, 5])),
            )
        )
    return running + new, nodes, before


@st.composite
def fragmented_clusters(draw: st.DrawFn) -> tuple[list[Demand], list[Node], list[Placement]]:
    """Nodes of 8 cards on one or two fabrics (or none), 2 to 4 cards a node taken by
    one-card replicas spread over them, and a new gang of two 8-card nodes (or one
    replica of 4 or 8 cards): the case defragmentation is for, which ``clusters`` seldom draws."""
    count = draw(st.integers(3, 7))
    fabrics = draw(
        st.lists(st.sampled_from(["f0", "f0", "f1", None]), min_size=count, max_size=count)
    )
    nodes = [node(f"n{i}", "T4", 8, fabric=fabrics[i]) for i in range(count)]
    taken = draw(st.integers(2, 4)) * count
    first = draw(st.integers(1, taken))
    running = []
    for i, replicas in enumerate((first, taken - first)):
        if replicas:
            running.append(
                Demand(
                    f"m{i}",
                    replicas,
                    (ONE,),
                    lifecycle=_spec(
                        draw(st.integers(0, replicas)),
                        ONE,
                        max_moving=draw(st.sampled_from([None, None, 0, 1, 3, "50%"])),
                    ),
                    priority=draw(st.sampled_from([0, 0, 1])),
                )
            )
    before = list(plan(running, nodes, (), NOW).placements)
    span = draw(st.sampled_from([1, 2, 2]))
    gpus = 8 if span > 1 else draw(st.sampled_from([4, 8]))
    wanted = profile(f"q{gpus}x{span}", "T4", gpus, nodes=span)
    new = Demand("new0", 1, (wanted,), lifecycle=_spec(1, wanted), priority=draw(st.integers(0, 1)))
    return [*running, new], nodes, before


def _counts(result: Plan) -> Counter[str]:
    return Counter(p.model for p in result.placements)


@settings(max_examples=150, deadline=None)
@given(st.one_of(clusters(), fragmented_clusters()))
def test_a_defragmentation_plan_never_overcommits_nor_costs_a_higher_priority_replica(
    case: tuple[list[Demand], list[Node], list[Placement]],
) -> None:
    demands, nodes, before = case
    on = plan(demands, nodes, before, NOW)
    off = plan(demands, nodes, before, NOW, StalenessPolicy(defragment=False))
    assert overcommitted(list(on.placements), nodes) == []
    # The step only adds: the same replicas kept and placed, plus the moves' copies.
    copies = Counter(m.copy.model for m in on.moves if m.copy is not None)
    assert _counts(on) == _counts(off) + copies
    assert on.remove == off.remove
    priority = {d.model: d.priority for d in demands}
    for m in on.moves:
        beneficiary = m.placement.moving_for
        assert priority[m.placement.model] <= priority[beneficiary]
        assert m.to != m.placement.nodes[0]
    # Moves of a model stay within its budget.
    moved = Counter(m.placement.model for m in on.moves)
    for d in demands:
        spec = d.lifecycle
        assert spec is not None
        if not spec.movable or spec.max_moving == 0:
            assert moved[d.model] == 0
        elif isinstance(spec.max_moving, int):
            assert moved[d.model] <= spec.max_moving


@settings(max_examples=100, deadline=None)
@given(st.one_of(clusters(), fragmented_clusters()), st.randoms(use_true_random=False))
def test_the_same_inputs_give_the_same_moves_in_any_order(
    case: tuple[list[Demand], list[Node], list[Placement]], rng: random.Random
) -> None:
    demands, nodes, before = case
    first = plan(demands, nodes, before, NOW)
    shuffled_nodes, shuffled = list(nodes), list(before)
    rng.shuffle(shuffled_nodes)
    rng.shuffle(shuffled)
    again = plan(demands, shuffled_nodes, shuffled, NOW)
    assert again.moves == first.moves
    assert again == first
    # The next round, from what the first one wrote, its copies still starting: the moved
    # replicas keep running and no other move starts meanwhile.
    if first.moves:
        later = NOW + timedelta(seconds=10)
        starting = {
            (p.model, p.replica): ReplicaStatus(STARTING, later, later, reported=True)
            for p in first.place
        }
        follow = plan(
            demands, nodes, first.placements, later, lifecycle=Lifecycle(statuses=starting)
        )
        assert not follow.moves
        assert {p.moving for p in follow.moving} == {m.reason for m in first.moves}
        assert not {r.placement.replica for r in follow.remove if r.placement.moving}
