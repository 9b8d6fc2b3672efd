"""A node given up and back: its replicas placed again where their engines still run.

Pure rounds (``scheduler.planner.plan``) on real catalogs, with the running copies a
returning node's agent reported (``Lifecycle.running``), as the daemon reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from catalog import Catalog, parse_model
from catalog.changes.digest import model_version
from scheduler.lifecycle.inputs import Lifecycle, RunningCopy
from scheduler.lifecycle.replica_reports import READY, STARTING, ReplicaStatus
from scheduler.planner.demands import demands
from scheduler.planner.fleet.placements import Placement
from scheduler.planner.plan import plan
from tests.unit.scheduler.placement_builders import NOW, node

CAT = Catalog.build(
    [
        parse_model(
            {
                "name": "chat",
                "source": "org/chat",
                "scaling": {"min": 1},
                "profiles": [{"name": "a100", "gpu_class": "A100"}],
            }
        )
    ],
    declared=True,
)
VERSION = model_version(CAT.models()[0])
# n2 fits better (fewer free cards): a round placing chat[0] anew would choose it.
NODES = [node("n1", gpus=8), node("n2", gpus=1)]


def copy(node_name: str = "n1", state: str = READY, **kw: object) -> RunningCopy:
    fields: dict[str, object] = {
        "node": node_name,
        "model": "chat",
        "replica": 0,
        "profile": "a100",
        "version": VERSION,
        "state": state,
        "endpoint": f"http://{node_name}:9000",
        **kw,
    }
    return RunningCopy(**fields)  # type: ignore[arg-type]


def round_with(
    running: Sequence[RunningCopy],
    current: Sequence[Placement] = (),
    states: dict[tuple[str, int], str] | None = None,
) -> tuple[tuple[Placement, ...], object]:
    statuses = {k: ReplicaStatus(s, NOW, NOW) for k, s in (states or {}).items()}
    lifecycle = Lifecycle(statuses=statuses, running=tuple(running))
    result = plan(demands(CAT), NODES, current, NOW, lifecycle=lifecycle)
    return result.place, result


def test_without_a_running_copy_a_round_places_the_replica_where_it_fits_best() -> None:
    placed, _ = round_with([])
    assert [p.nodes for p in placed] == [("n2",)]


def test_an_unplaced_replica_is_placed_again_where_its_engine_still_runs() -> None:
    placed, result = round_with([copy("n1")])
    (again,) = placed
    assert (again.model, again.replica, again.nodes, again.profile) == ("chat", 0, ("n1",), "a100")
    assert again.version == VERSION
    assert result.again == (copy("n1"),)  # type: ignore[attr-defined]
    assert any("placed again on n1" in note for _, note in result.notes)  # type: ignore[attr-defined]


def test_a_replacement_ready_elsewhere_wins_over_the_returning_copy() -> None:
    elsewhere = plan(demands(CAT), NODES, (), NOW).place
    assert [p.nodes for p in elsewhere] == [("n2",)]
    placed, result = round_with([copy("n1")], elsewhere, {("chat", 0): READY})
    assert placed == ()
    assert result.remove == ()  # type: ignore[attr-defined]
    assert result.again == ()  # type: ignore[attr-defined]


def test_a_replacement_still_starting_elsewhere_gives_way_to_the_running_copy() -> None:
    elsewhere = plan(demands(CAT), NODES, (), NOW).place
    placed, result = round_with([copy("n1")], elsewhere, {("chat", 0): STARTING})
    assert [(p.replica, p.nodes) for p in placed] == [(0, ("n1",))]
    (removal,) = result.remove  # type: ignore[attr-defined]
    assert removal.placement.nodes == ("n2",)
    assert "its engine still runs on n1" in removal.reason


def test_a_copy_of_another_version_or_profile_or_on_a_node_not_fresh_is_not_placed_again() -> None:
    for other in (
        copy("n1", version="0" * 16),
        copy("n1", profile="h100"),
        copy("n1", replica=1),  # a slot the model no longer wants
    ):
        placed, _ = round_with([other])
        assert [p.nodes for p in placed] == [("n2",)], other
    silent = [replace(n, reported_at=NOW.replace(hour=11)) if n.name == "n1" else n for n in NODES]
    result = plan(demands(CAT), silent, (), NOW, lifecycle=Lifecycle(running=(copy("n1"),)))
    assert [p.nodes for p in result.place] == [("n2",)]


def test_the_running_copies_are_recorded_with_the_round_and_read_back() -> None:
    lifecycle = Lifecycle(running=(copy("n1"), copy("n2", STARTING, endpoint=None)))
    assert Lifecycle.from_json(lifecycle.to_json()) == lifecycle
    older = lifecycle.to_json()
    del older["running"]  # a round recorded before running copies were kept
    assert Lifecycle.from_json(older).running == ()
