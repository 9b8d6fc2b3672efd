"""The disruption budgets patched from the round before's (``BudgetMemo``) are ``budgets``.

A round's budgets count, per model, the placements that count as ready and those moving
over every placement; a lost node's round keeps all but a few of the round before's, with
the same replica states. The memo patches the kept counts by the placements gone and come
and by the states that changed, counts the few others afresh, and judges again only the
models whose counts moved.
"""

from __future__ import annotations

import functools
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.lifecycle.inputs import Lifecycle, ModelLifecycle
from scheduler.lifecycle.replica_reports import FAILED, PLACED, READY, ReplicaStatus
from scheduler.planner.defrag import BudgetMemo, budgets
from scheduler.planner.fleet.placements import Demand, Placement
from tests.unit.scheduler.placement_builders import NOW, profile

MODELS = ("a", "b", "c", "d")
SPECS = {
    "a": ModelLifecycle(min_ready=2, max_moving=1),
    "b": ModelLifecycle(max_moving="50%"),
    "c": ModelLifecycle(movable=False),
    "d": None,
}
DEMANDS = [Demand(m, 4, (profile(gpus=1),), lifecycle=SPECS[m]) for m in MODELS]


def _status(state: str, reported: bool = True) -> ReplicaStatus:
    return ReplicaStatus(state, NOW, NOW - timedelta(seconds=5), reported=reported)


STATES = st.sampled_from(
    [_status(READY), _status(PLACED), _status(FAILED), _status(PLACED, reported=False)]
)


# The strategies drawn from below, made once (as in test_round_chain.py): built inline,
# each draw made new strategy objects for Hypothesis to validate and label again.
_MOVING = st.sampled_from(["", "", "to make room"])
_MODEL = st.sampled_from(MODELS)
_0_TO_5 = st.integers(0, 5)
_NODE = st.sampled_from(["n0", "n1", "n2"])


# Made once, so that the lists of placements drawn in the test are made once too
# (st.lists keeps those whose arguments it has seen).
@functools.cache
@st.composite
def a_placement(draw: st.DrawFn) -> Placement:
    moving = draw(_MOVING)
    return Placement(
        draw(_MODEL),
        draw(_0_TO_5),
        "p",
        (draw(_NODE),),
        1,
        "A100",
        moving=moving,
    )


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_budgets_patched_round_after_round_are_the_budgets_counted_afresh(
    data: st.DataObject,
) -> None:
    """Round after round, placements kept less and plus some, the others (placed now, held)
    drawn afresh, replica states replaced, gone and new: the memo's answer is ``budgets``
    of every placement, and the caller's changes to it do not reach the next."""
    draw = data.draw
    memo = BudgetMemo()
    keep = draw(st.lists(a_placement(), max_size=12))
    statuses: dict[tuple[str, int], ReplicaStatus] = {}
    demands = DEMANDS
    for round_ in range(draw(st.integers(2, 6))):
        if round_:
            keep = [p for p in keep if draw(st.integers(0, 4))]
            at = draw(st.integers(0, len(keep)))
            keep[at:at] = draw(st.lists(a_placement(), max_size=3))
            if draw(st.integers(0, 5)) == 0:
                demands = list(DEMANDS)  # the same demands, other objects: counted afresh
        others = draw(st.lists(a_placement(), max_size=3))
        if draw(st.booleans()):
            statuses = dict(statuses)
            for p in (
                draw(st.lists(st.sampled_from([*keep, *others]), max_size=4))
                if (keep or others)
                else []
            ):
                statuses[p.model, p.replica] = draw(STATES)
            for key in (
                draw(st.lists(st.sampled_from(sorted(statuses)), max_size=2)) if (statuses) else []
            ):
                statuses.pop(key, None)
        lifecycle = Lifecycle(statuses=statuses)
        got = memo.of(demands, keep, others, lifecycle)
        assert got == budgets(demands, [*keep, *others], lifecycle)
        got[0]["a"] = 99  # the caller's (the step marks models in a rollout unmovable)
        got[1]["a"] = False


def test_a_kept_replicas_state_turning_ready_moves_its_models_budget() -> None:
    """The same placements kept, one state replaced (the round after a write reads the
    states back): its model is judged again (below its scaling.min, then not)."""
    placed = [Placement("a", r, "p", (f"n{r}",), 1, "A100") for r in range(2)]
    starting = {(p.model, p.replica): _status(PLACED) for p in placed}
    memo = BudgetMemo()
    first = memo.of(DEMANDS, placed, [], Lifecycle(statuses=starting))
    assert first[0]["a"] == 0  # 0 ready, below 2
    ready = {**starting, ("a", 0): _status(READY), ("a", 1): _status(READY)}
    got = memo.of(DEMANDS, placed, [], Lifecycle(statuses=ready))
    assert got == budgets(DEMANDS, placed, Lifecycle(statuses=ready))
    assert got[0]["a"] == 1 and memo.patched == 1


def test_a_model_counted_among_the_others_the_round_before_is_judged_again() -> None:
    """A replica placed by the round (among the others) is no longer there the next: its
    model's counts fall back to the kept ones, and its entries are judged again."""
    kept = [Placement("a", 0, "p", ("n0",), 1, "A100")]
    placed = [Placement("a", 1, "p", ("n1",), 1, "A100")]
    memo = BudgetMemo()
    assert memo.of(DEMANDS, kept, placed, Lifecycle())[0]["a"] == 1  # 2 ready: max_moving
    got = memo.of(DEMANDS, kept, [], Lifecycle())
    assert got == budgets(DEMANDS, kept, Lifecycle())
    assert got[0]["a"] == 0 and memo.patched == 1
