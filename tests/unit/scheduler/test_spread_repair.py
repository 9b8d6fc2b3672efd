"""The spread repair (scheduler.planner.spread_repair): after the quality floor picks a plan, the
round's new replicas are spread by same-shape swaps and moves into free room.

The invariant held here, checked by an independent brute-force checker
(``bench.placement.spreadcheck``): after the repair, no new replica shares a node with
another replica of its model while

- a new replica of another model with the same shape could trade nodes with it
  (both profiles admit the other's nodes, the other model is not on its nodes,
  neither model's spread over its ``spread_by`` label gets less even), or
- free room is left on nodes holding none of its model that its profile fits
  (for models without ``spread_required``, and with ``spread_by`` only for
  one-node replicas: there the value comes before the node).

And the repair never overcommits, never changes the GPU count or which
replicas run with which profile, and never touches a running replica.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from datetime import timedelta

from hypothesis import example, given, settings
from hypothesis import strategies as st

from bench.placement import firstfit, spreadcheck
from catalog.definition.views import PlacementProfile
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.planner.fleet.capacity import Capacity
from scheduler.planner.fleet.fit import selector_key
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement
from scheduler.planner.repair_groups import BUILD_AFTER
from scheduler.planner.spread import Spread
from scheduler.planner.spread_repair import Repaired, repair
from tests.unit.scheduler.placement_builders import NOW, node, overcommitted, profile, run
from tests.unit.scheduler.test_placement_policy import POLICY_CATALOGS
from tests.unit.scheduler.test_placement_properties import INVENTORIES

moderate = settings(max_examples=80, deadline=None)
NO_PREEMPTION = StalenessPolicy(preemption=False)


def _fresh(nodes: Sequence[Node]) -> set[str]:
    return {n.name for n in nodes if NOW - n.reported_at <= timedelta(seconds=90)}


def _repair(
    demands: Sequence[Demand],
    nodes: Sequence[Node],
    kept: Sequence[Placement],
    new: Sequence[Placement],
    *,
    index_after: int | None = BUILD_AFTER,
) -> Repaired:
    """The repair on its own, as the planner calls it, over ``kept`` and ``new``."""
    capacity = Capacity(nodes, _fresh(nodes))
    for p in (*kept, *new):
        capacity.consume(p.nodes, p.gpus_per_node, p.memory_gb_per_node)
    spread = Spread.of(demands, {n.name: n for n in nodes}, (*kept, *new))
    eligible: dict[object, list[str]] = {}

    def eligible_nodes(p: PlacementProfile) -> list[str]:
        key = (p.gpu_class, selector_key(p.node_selector))
        if key not in eligible:
            eligible[key] = capacity.eligible(p)
        return eligible[key]

    return repair(demands, new, spread, capacity, eligible=eligible_nodes, index_after=index_after)


def _usage(placements: Sequence[Placement]) -> Counter[tuple[str, str]]:
    used: Counter[tuple[str, str]] = Counter()
    for p in placements:
        for name in p.nodes:
            used[(name, "gpus")] += p.gpus_per_node
            used[(name, "memory")] += p.memory_gb_per_node
    return used


def _room_faults(check: spreadcheck.SpreadCheck, demands: Sequence[Demand]) -> set[str]:
    """Free-room faults of the models the repair promises them for."""
    rules = {d.model: d for d in demands}
    return {
        m
        for m in check.by_room
        if not rules[m].spread_required
        and (rules[m].spread_by is None or all(p.nodes == 1 for p in rules[m].profiles))
    }


def _invariant_holds(
    demands: Sequence[Demand],
    nodes: Sequence[Node],
    placements: Sequence[Placement],
    new: Sequence[Placement],
    unplaced: Collection[str] = (),
) -> spreadcheck.SpreadCheck:
    found = spreadcheck.check(demands, nodes, placements, new, _fresh(nodes), unplaced=unplaced)
    assert found.swaps == (), f"a swap would still separate co-located replicas: {found.swaps}"
    if not unplaced:
        # With a replica left unplaced, a move into free room is made only when it
        # cannot help that replica (the next round must change nothing).
        assert _room_faults(found, demands) == set(), "free room left that would separate them"
    return found


# -- the repair on its own, over what the unspread baselines place ---------------------


# Best fit stacks both replicas of each model on one node: a swap and free room.
STACKED_NODES = [node("n1", "L4", 2), node("n2", "L4", 2), node("n3", "L4", 1)]
STACKED = [
    Demand("m0", 2, (profile("l4", "L4", 1),)),
    Demand("m1", 2, (profile("l4", "L4", 1),)),
]


@moderate
@given(POLICY_CATALOGS, INVENTORIES, st.integers(0, 6), st.booleans())
@example(STACKED, STACKED_NODES, 0, False)
@example(STACKED, STACKED_NODES[:2], 0, True)
def test_the_repair_spreads_a_baseline_without_overcommitting_or_losing_a_gpu(
    demands: list[Demand], nodes: list[Node], running: int, first: bool
) -> None:
    baseline = (firstfit.place if first else firstfit.best_fit)(demands, nodes, NOW)
    kept, new = baseline[:running], baseline[running:]

    out = _repair(demands, nodes, kept, new)

    after = [*kept, *out.placed]
    assert overcommitted(after, nodes) == []
    # The same replicas, with the same profiles and sizes: the GPU count cannot drop.
    assert sorted((p.model, p.replica, p.profile, p.gpus_per_node) for p in out.placed) == sorted(
        (p.model, p.replica, p.profile, p.gpus_per_node) for p in new
    )
    assert sum(p.gpus_per_node * len(p.nodes) for p in after) == sum(
        p.gpus_per_node * len(p.nodes) for p in baseline
    )
    if out.moves == 0:
        # Swaps alone: every node carries exactly what it carried.
        assert _usage(after) == _usage(baseline)
    _invariant_holds(demands, nodes, after, out.placed)


# -- the partner index gives the plan the scan gave -------------------------------------


# The strategies drawn from below, made once (as in test_round_chain.py): built inline,
# each draw made new strategy objects for Hypothesis to validate and label again.
_SIZE = st.integers(2, 10)
_CLASS = st.sampled_from(["L4", "T4"])
_GPUS = st.integers(1, 8)
_ZONE = st.sampled_from(["a", "b", "c", None])
_MODEL_COUNT = st.integers(2, 5)
_PRIORITY = st.integers(0, 1)
_CLASSES = st.lists(st.sampled_from(["L4", "T4"]), min_size=1, max_size=2)
_REPLICAS = st.integers(1, 14)
_SPREAD_BY = st.sampled_from([None, None, "zone"])
_0_TO_8 = st.integers(0, 8)
_BOOL = st.booleans()


@st.composite
def _crowded(draw: st.DrawFn) -> tuple[list[Demand], list[Node], int, bool]:
    """Several models of one or two one-node shapes stacked on a few nodes: the case
    the partner index (``Group.partner_keys``) serves, with models with and without
    ``spread_by`` (whose swaps the index treats differently) side by side."""
    size = draw(_SIZE)
    nodes = [
        node(
            f"n{i}",
            draw(_CLASS),
            draw(_GPUS),
            labels={"zone": z} if (z := draw(_ZONE)) else None,
        )
        for i in range(size)
    ]
    demands = []
    for i in range(draw(_MODEL_COUNT)):
        profiles = tuple(profile(f"p{c}", c, 1, priority=draw(_PRIORITY)) for c in draw(_CLASSES))
        demands.append(
            Demand(
                f"m{i}",
                draw(_REPLICAS),
                profiles,
                priority=draw(_PRIORITY),
                spread_by=draw(_SPREAD_BY),
            )
        )
    return demands, nodes, draw(_0_TO_8), draw(_BOOL)


def _outcome(out: Repaired) -> tuple[object, ...]:
    return out.placed, out.notes, out.swaps, out.moves


# Found by the property with the index's counts left stale after a swap: m1[0] joins
# m1[3] on n0, and a later swap needs n0's new count of m1.
STALE_COUNT = (
    [Demand("m0", 6, (profile("t4", "T4", 1),)), Demand("m1", 8, (profile("t4", "T4", 1),))],
    [node(f"n{i}", "T4", gpus) for i, gpus in enumerate((3, 1, 1, 4, 5))],
    0,
    False,
)

# A partner with spread_by may leave a node holding no more of it than the candidate's
# (m1[0], one on n7 as on n9) when that evens its zones: the index must not count it out.
ZONE_PARTNER = (
    [
        Demand("m0", 14, (profile("t4", "T4", 1),)),
        Demand("m1", 4, (profile("t4", "T4", 1),), spread_by="zone"),
    ],
    [
        node(name, "T4", gpus, labels={"zone": zone})
        for name, gpus, zone in (("n6", 1, "a"), ("n7", 4, "a"), ("n8", 8, "a"), ("n9", 7, "b"))
    ],
    0,
    False,
)


@moderate
@given(_crowded())
@example(STALE_COUNT)
@example(ZONE_PARTNER)
def test_the_partner_index_changes_no_swap_the_scan_would_make(
    case: tuple[list[Demand], list[Node], int, bool],
) -> None:
    demands, nodes, running, first = case
    baseline = (firstfit.place if first else firstfit.best_fit)(demands, nodes, NOW)
    kept, new = baseline[:running], baseline[running:]

    scanned = _repair(demands, nodes, kept, new, index_after=None)
    indexed = _repair(demands, nodes, kept, new, index_after=0)
    later = _repair(demands, nodes, kept, new)

    assert _outcome(indexed) == _outcome(scanned)
    assert _outcome(later) == _outcome(scanned)


def test_the_partner_index_and_the_scan_agree_on_a_round_of_many_swaps() -> None:
    """Twelve models stacked by best fit on 16 nodes: dozens of swaps and moves, each of
    which the index must follow (a stale count there would pick another partner)."""
    nodes = [node(f"n{i:02d}", "L4", 8, labels={"zone": "ab"[i % 2]}) for i in range(16)]
    demands = [
        Demand(f"m{i}", 4 + i, (profile("l4", "L4", 1),), spread_by="zone" if i % 3 else None)
        for i in range(12)
    ]
    stacked = firstfit.best_fit(demands, nodes, NOW)

    scanned = _repair(demands, nodes, stacked[:10], stacked[10:], index_after=None)
    indexed = _repair(demands, nodes, stacked[:10], stacked[10:], index_after=0)
    later = _repair(demands, nodes, stacked[:10], stacked[10:])

    assert indexed.swaps > 20
    assert _outcome(indexed) == _outcome(scanned)
    assert _outcome(later) == _outcome(scanned)


def test_two_models_stacked_by_best_fit_end_up_one_replica_of_each_per_node() -> None:
    nodes = [node("n1", "L4", 2), node("n2", "L4", 2)]
    embed = Demand("embed", 2, (profile("l4", "L4", 1),))
    rerank = Demand("rerank", 2, (profile("l4", "L4", 1),))
    stacked = firstfit.best_fit([embed, rerank], nodes, NOW)
    assert sorted(p.nodes for p in stacked if p.model == "embed") == [("n1",), ("n1",)]

    out = _repair([embed, rerank], nodes, [], stacked)

    assert out.swaps == 1 and out.moves == 0
    assert sorted(p.nodes for p in out.placed if p.model == "embed") == [("n1",), ("n2",)]
    assert sorted(p.nodes for p in out.placed if p.model == "rerank") == [("n1",), ("n2",)]
    assert "swapping nodes with" in out.notes[0][1]


def test_a_swap_is_refused_when_the_partner_s_labels_do_not_fit_the_other_node() -> None:
    nodes = [
        node("n1", "L4", 2, labels={"zone": "a"}),
        node("n2", "L4", 2, labels={"zone": "b"}),
    ]
    embed = Demand("embed", 2, (profile("l4", "L4", 1),))
    pinned = Demand("pinned", 2, (profile("l4", "L4", 1, selector={"zone": "b"}),))
    stacked = [
        Placement("embed", 0, "l4", ("n1",), 1, "L4"),
        Placement("embed", 1, "l4", ("n1",), 1, "L4"),
        Placement("pinned", 0, "l4", ("n2",), 1, "L4"),
        Placement("pinned", 1, "l4", ("n2",), 1, "L4"),
    ]

    out = _repair([embed, pinned], nodes, [], stacked)

    assert out.placed == stacked  # pinned may not go to zone a; nothing else is free
    assert out.notes == []


def test_a_running_replica_is_never_moved_to_spread() -> None:
    nodes = [node("n1", "L4", 2), node("n2", "L4", 2)]
    embed = Demand("embed", 2, (profile("l4", "L4", 1),))
    rerank = Demand("rerank", 2, (profile("l4", "L4", 1),))
    running = [
        Placement("embed", 0, "l4", ("n1",), 1, "L4"),
        Placement("embed", 1, "l4", ("n1",), 1, "L4"),
    ]

    result = run([embed, rerank], nodes, running)

    assert sorted(p.nodes for p in result.keep) == [("n1",), ("n1",)]
    assert not result.remove


# -- whole rounds ----------------------------------------------------------------------


# Rounds a baseline wins, so that the repair has something to repair: the
# generated fleets are small and the round's own way (which spreads) nearly always
# wins there. With the repair off, each of these fails the invariant.
#
# Best fit wins: the round's way spreads ``a`` onto zone b's node, and one replica of
# ``b`` (zone b only) is left out; best fit stacks ``a`` on n1 and ``c`` on n3 and
# places all six. The repair swaps a replica of ``a`` with one of ``c``.
ZONED_NODES = [
    node("n1", "L4", 2, labels={"zone": "a"}),
    node("n2", "L4", 2, labels={"zone": "b"}),
    node("n3", "L4", 2, labels={"zone": "a"}),
]
BEST_FIT_WINS = [
    Demand("a", 2, (profile("l4", "L4", 1),)),
    Demand("b", 2, (profile("l4b", "L4", 1, selector={"zone": "b"}),)),
    Demand("c", 2, (profile("l4", "L4", 1),)),
]
# First fit wins: best fit and the round's way put ``a`` on the one-card nodes, so
# ``b`` (zone b only) finds n2 taken; first fit stacks ``a`` on n1 and places ``b``.
# The repair moves a replica of ``a`` into n3's free card.
FIRST_FIT_NODES = [
    node("n1", "L4", 4, labels={"zone": "a"}),
    node("n2", "L4", 1, labels={"zone": "b"}),
    node("n3", "L4", 1, labels={"zone": "a"}),
]
FIRST_FIT_WINS = [
    Demand("a", 2, (profile("l4", "L4", 1),)),
    Demand("b", 1, (profile("l4b", "L4", 1, selector={"zone": "b"}),)),
]


@moderate
@given(POLICY_CATALOGS, POLICY_CATALOGS, INVENTORIES)
@example([], BEST_FIT_WINS, ZONED_NODES)
@example([], FIRST_FIT_WINS, FIRST_FIT_NODES)
def test_after_a_round_no_swap_or_free_node_would_separate_co_located_replicas(
    before: list[Demand], demands: list[Demand], nodes: list[Node]
) -> None:
    current = run(before, nodes, policy=NO_PREEMPTION).placements

    result = run(demands, nodes, current, policy=NO_PREEMPTION)

    _invariant_holds(
        demands, nodes, result.placements, result.place, {u.model for u in result.unplaced}
    )
    # Running replicas stay where they ran.
    was = {(p.model, p.replica): p.nodes for p in current}
    assert all(was[(p.model, p.replica)] == p.nodes for p in result.keep)


def test_the_checker_finds_what_the_repair_repairs() -> None:
    """The checker can fail: on best fit's stacked plan it reports the swap."""
    nodes = [node("n1", "L4", 2), node("n2", "L4", 2)]
    demands = [
        Demand("embed", 2, (profile("l4", "L4", 1),)),
        Demand("rerank", 2, (profile("l4", "L4", 1),)),
    ]
    stacked = firstfit.best_fit(demands, nodes, NOW)

    found = spreadcheck.check(demands, nodes, stacked, stacked, _fresh(nodes))

    assert found.faults == {"embed", "rerank"}
    assert found.by_room == frozenset()


def test_swapped_replicas_explain_themselves() -> None:
    nodes = [node("n1", "L4", 2), node("n2", "L4", 2)]
    demands = [
        Demand("embed", 2, (profile("l4", "L4", 1),)),
        Demand("rerank", 2, (profile("l4", "L4", 1),)),
    ]
    stacked = firstfit.best_fit(demands, nodes, NOW)
    out = _repair(demands, nodes, [], stacked)

    moved = {m for m, _ in out.notes}

    assert moved == {"embed", "rerank"}
    assert all(note.startswith("replica ") and " moved from " in note for _, note in out.notes)


def test_a_preemptor_is_never_moved_to_spread_its_model() -> None:
    """A replica placed by evicting others stays where its evictions made room.

    hi[1] fits nowhere, evicts lo on x and lands next to the running hi[0]; hi2
    (same shape and priority) sits alone on w. Swapping hi[1] with hi2 would spread
    hi, but then the eviction would have made room for hi2, which needed none.
    """
    nodes = [node("x", "L4", 2), node("w", "L4", 1)]
    l4 = profile("l4", "L4", 1)
    demands = [
        Demand("hi2", 1, (l4,), priority=10),
        Demand("hi", 2, (l4,), priority=10),
        Demand("lo", 1, (l4,)),
    ]
    running = [
        Placement("lo", 0, "l4", ("x",), 1, "L4"),
        Placement("hi", 0, "l4", ("x",), 1, "L4"),
    ]

    result = run(demands, nodes, running)

    assert [r.reason for r in result.remove] == ["preempted by hi[1]"]
    assert [(p.model, p.replica, p.nodes) for p in result.place] == [
        ("hi", 1, ("x",)),
        ("hi2", 0, ("w",)),
    ]
    assert result.notes == ()


@moderate
@given(POLICY_CATALOGS, POLICY_CATALOGS, INVENTORIES)
def test_with_preemption_every_preemptor_runs_where_it_evicted(
    before: list[Demand], demands: list[Demand], nodes: list[Node]
) -> None:
    current = run(before, nodes).placements

    result = run(demands, nodes, current)

    at = {f"{p.model}[{p.replica}]": set(p.nodes) for p in result.placements}
    for removal in result.remove:
        if removal.reason.startswith("preempted by "):
            preemptor = removal.reason.removeprefix("preempted by ")
            assert at[preemptor] & set(removal.placement.nodes), (
                f"{preemptor} runs on {sorted(at[preemptor])}, not where it evicted "
                f"{removal.placement.model}[{removal.placement.replica}]"
            )
