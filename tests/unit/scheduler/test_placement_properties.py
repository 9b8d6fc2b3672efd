"""Properties of every plan, over generated inventories, catalogs and current placements.

The current placements are partly a previous round's result on another
inventory (what a real round starts from) and partly junk (unknown models,
profiles, nodes, shapes), which a round must clean up without tripping.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.views import PlacementProfile
from scheduler import Demand, Node, Placement
from scheduler.fit import gpu_class_matches, missing_label
from tests.unit.scheduler.placement_builders import NOW, node, overcommitted, profile, run

NODE_NAMES = [f"n{i}" for i in range(10)]
GPU_CLASSES = ["A100", "T4"]
LABELS = st.dictionaries(st.sampled_from(["zone", "tier"]), st.sampled_from(["a", "b"]), max_size=2)

moderate = settings(max_examples=100, deadline=None)


@st.composite
def a_node(draw: st.DrawFn, name: str) -> Node:
    gpu_class = draw(st.sampled_from([*GPU_CLASSES, None]))
    gpus = 0 if gpu_class is None else draw(st.sampled_from([1, 2, 4, 8]))
    return node(
        name,
        gpu_class,
        gpus,
        memory_gb=draw(st.sampled_from([None, 16.0, 64.0, 256.0])),
        labels=draw(LABELS),
        fabric=draw(st.sampled_from([None, "f1", "f2"])),
        reserved=draw(st.integers(0, gpus)),
        # Fresh, fresh, stale within grace, lost.
        silent_for=timedelta(seconds=draw(st.sampled_from([0, 60, 120, 600]))),
    )


@st.composite
def inventories(draw: st.DrawFn) -> list[Node]:
    names = draw(st.lists(st.sampled_from(NODE_NAMES), unique=True, max_size=len(NODE_NAMES)))
    return [draw(a_node(name)) for name in names]


@st.composite
def a_profile(draw: st.DrawFn, name: str) -> PlacementProfile:
    gpu_class = draw(st.sampled_from([*GPU_CLASSES, None]))
    cpu = gpu_class is None
    return profile(
        name,
        gpu_class,
        0 if cpu else draw(st.sampled_from([1, 2, 4, 8])),
        nodes=1 if cpu else draw(st.sampled_from([1, 1, 2, 3])),
        priority=draw(st.integers(0, 2)),
        selector=draw(st.dictionaries(st.just("zone"), st.sampled_from(["a", "b"]), max_size=1)),
        memory_gb=draw(st.sampled_from([0, 8, 32, 100])),
    )


@st.composite
def catalogs(draw: st.DrawFn) -> list[Demand]:
    models = draw(st.lists(st.sampled_from(["m0", "m1", "m2"]), unique=True, max_size=3))
    demands = []
    for model in models:
        count = draw(st.integers(1, 3))
        profiles = tuple(draw(a_profile(f"p{i}")) for i in range(count))
        demands.append(Demand(model, draw(st.integers(0, 4)), profiles))
    return demands


@st.composite
def junk_placements(draw: st.DrawFn) -> Placement:
    gpu_class = draw(st.sampled_from([*GPU_CLASSES, None]))
    return Placement(
        model=draw(st.sampled_from(["m0", "m1", "m2", "retired"])),
        replica=draw(st.integers(0, 5)),
        profile=draw(st.sampled_from(["p0", "p1", "p2", "old"])),
        nodes=tuple(
            draw(st.lists(st.sampled_from([*NODE_NAMES, "ghost"]), min_size=1, max_size=3))
        ),
        gpus_per_node=0 if gpu_class is None else draw(st.sampled_from([1, 2, 4, 8])),
        gpu_class=gpu_class,
        memory_gb_per_node=draw(st.sampled_from([0, 8, 32, 100])),
    )


@st.composite
def rounds(draw: st.DrawFn) -> tuple[list[Demand], list[Node], list[Placement]]:
    """A catalog, an inventory, and placements from a previous round plus junk."""
    demands = draw(catalogs())
    nodes = draw(inventories())
    previous = run(draw(catalogs()), draw(inventories())).placements
    current = [*previous, *draw(st.lists(junk_placements(), max_size=4))]
    return demands, nodes, draw(st.permutations(current))


@moderate
@given(rounds())
def test_no_node_is_ever_overcommitted(inputs: tuple[list[Demand], list[Node], list[Placement]]) -> None:
    demands, nodes, current = inputs

    result = run(demands, nodes, current)

    assert overcommitted(result.placements, nodes) == []


@moderate
@given(rounds(), st.data())
def test_the_plan_depends_on_the_inputs_not_on_their_order(
    inputs: tuple[list[Demand], list[Node], list[Placement]], data: st.DataObject
) -> None:
    demands, nodes, current = inputs
    shuffled_nodes = data.draw(st.permutations(nodes))
    shuffled_current = data.draw(st.permutations(current))

    assert run(demands, shuffled_nodes, shuffled_current) == run(demands, nodes, current)


@moderate
@given(rounds())
def test_every_replica_is_placed_or_explained(
    inputs: tuple[list[Demand], list[Node], list[Placement]],
) -> None:
    demands, nodes, current = inputs

    result = run(demands, nodes, current)

    for d in demands:
        placed = sorted(p.replica for p in result.placements if p.model == d.model)
        unplaced = sorted(u.replica for u in result.unplaced if u.model == d.model)
        assert sorted(placed + unplaced) == list(range(d.replicas))
    assert all(u.reason.strip() for u in result.unplaced)
    assert {p.model for p in result.placements} <= {d.model for d in demands}


@moderate
@given(rounds())
def test_every_current_placement_is_kept_or_removed_with_a_reason(
    inputs: tuple[list[Demand], list[Node], list[Placement]],
) -> None:
    demands, nodes, current = inputs

    result = run(demands, nodes, current)

    assert len(result.keep) + len(result.remove) == len(current)
    assert Counter(r.placement for r in result.remove) <= Counter(current)
    assert all(r.reason for r in result.remove)


@moderate
@given(rounds())
def test_new_replicas_go_only_where_they_fit(
    inputs: tuple[list[Demand], list[Node], list[Placement]],
) -> None:
    demands, nodes, current = inputs
    by_name = {n.name: n for n in nodes}
    profiles = {(d.model, p.name): p for d in demands for p in d.profiles}

    result = run(demands, nodes, current)

    for placement in result.place:
        wanted = profiles[placement.model, placement.profile]
        hosts = [by_name[name] for name in placement.nodes]
        assert len(set(placement.nodes)) == wanted.nodes == len(hosts)
        assert all(NOW - h.reported_at <= timedelta(seconds=90) for h in hosts)
        assert all(gpu_class_matches(h.gpu_class, wanted) for h in hosts)
        assert all(missing_label(h.labels, wanted.node_selector) is None for h in hosts)
        if wanted.nodes > 1:
            assert len({h.fabric for h in hosts}) == 1
            assert hosts[0].fabric is not None
        assert (placement.gpus_per_node, placement.gpu_class) == (
            wanted.gpus_per_node,
            wanted.gpu_class,
        )


@moderate
@given(rounds())
def test_replanning_the_result_with_nothing_changed_is_a_fixed_point(
    inputs: tuple[list[Demand], list[Node], list[Placement]],
) -> None:
    demands, nodes, current = inputs
    first = run(demands, nodes, current)

    second = run(demands, nodes, first.placements)

    assert second.place == ()
    assert second.remove == ()
    assert second.keep == first.placements
    assert second.unplaced == first.unplaced
    assert second.mass_loss == first.mass_loss

