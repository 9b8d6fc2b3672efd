"""Placing missing replicas honours the replica lifecycle: held slots, back-offs, fingerprints."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from catalog.definition.views import PlacementProfile
from scheduler.lifecycle.inputs import ModelLifecycle
from scheduler.planner.fleet.capacity import Capacity
from scheduler.planner.fleet.placements import Demand, Placement
from scheduler.planner.packing import Attempt, Strategy, options, place_missing
from scheduler.planner.spread import Spread
from tests.unit.scheduler.placement_builders import node, profile

A100x2 = profile("a100x2", gpus=2)
GANG = profile("gang", gpus=8, nodes=2)


def lifecycle(fingerprint: str) -> ModelLifecycle:
    return ModelLifecycle(
        fingerprints={"a100x2": fingerprint, "gang": fingerprint},
        startup_timeouts={},
        max_surge=1,
        max_unavailable=0,
    )


def fleet(count: int) -> Capacity:
    nodes = [node(f"n{i}", gpus=8, fabric="ib") for i in range(count)]
    return Capacity(nodes, frozenset(n.name for n in nodes))


def test_capacity_never_offers_an_avoided_node_by_any_search() -> None:
    capacity = fleet(3)
    avoid = {"n0", "n1"}
    assert capacity.best_node(A100x2, avoid) == "n2"
    assert capacity.first_node(A100x2, avoid) == "n2"
    assert [e[2] for e in capacity.fitting(A100x2, avoid)] == ["n2"]
    assert capacity.best_gang(GANG, {"n0"}) == ("n1", "n2")
    assert capacity.first_gang(GANG, {"n0"}) == ("n1", "n2")
    assert capacity.first_gang(GANG, avoid) is None


@given(
    strategy=st.sampled_from(list(Strategy)),
    avoided=st.sets(st.sampled_from(["n0", "n1", "n2", "n3"]), max_size=3),
    prof=st.sampled_from([A100x2, GANG]),
    spread=st.booleans(),
)
def test_no_strategy_places_a_model_on_a_node_it_backs_off_from(
    strategy: Strategy, avoided: set[str], prof: PlacementProfile, spread: bool
) -> None:
    capacity = fleet(4)
    nodes = {f"n{i}": capacity.node(f"n{i}") for i in range(4)}
    demand = Demand("m", 3, (prof,), spread_by="zone" if spread else None)
    attempt = Attempt(
        strategy,
        capacity,
        Spread.of([demand], nodes, ()),
        avoid={"m": frozenset(avoided)},
        fingerprints={"m": {prof.name: "v2"}},
    )
    for replica in range(3):
        placed = attempt.place_one("m", replica, options(demand.profiles), set())
        if placed is not None:
            assert not set(placed.nodes) & avoided
            assert placed.fingerprint == "v2"


def test_held_replicas_take_their_slot_and_room_without_counting_and_back_off_is_not_no_room() -> (
    None
):
    capacity = fleet(2)
    held = Placement("old", 0, "a100x2", ("n0",), 2, "A100", fingerprint="v1")
    capacity.consume(held.nodes, 2, 0)
    demands = [
        Demand("old", 1, (A100x2,), lifecycle("v2")),
        # Backs off from n1: finding no room there must not stop "other" from using n1.
        Demand("avoider", 1, (A100x2,), lifecycle("v1")),
        Demand("other", 1, (A100x2,), lifecycle("v1")),
    ]
    nodes = {f"n{i}": capacity.node(f"n{i}") for i in range(2)}
    attempt = place_missing(
        demands,
        (),
        capacity,
        Spread.of(demands, nodes, ()),
        held=[held],
        reserved={"other": {0}},
        avoid={"avoider": frozenset({"n0", "n1"})},
    )
    placed = {p.model: p for p in attempt.placed}
    # The held replica keeps slot 0; the new one is slot 1 and runs the new fingerprint.
    assert (placed["old"].replica, placed["old"].fingerprint) == (1, "v2")
    assert placed["other"].replica == 1  # slot 0 is reserved this round
    assert "avoider" not in placed and attempt.failed["avoider"][1] == [0]
    assert capacity.free_gpus("n0") + capacity.free_gpus("n1") == 16 - 2 - 2 - 2
