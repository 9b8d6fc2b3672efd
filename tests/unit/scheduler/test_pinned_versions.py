"""A placement pins its model's version; only a rollout changes what a replica runs.

Pure: demands come from real catalogs (``scheduler.planner.demands``), so the versions are the
catalog's own digests, and rounds feed each other as the daemon's do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from catalog import Catalog, parse_model
from catalog.changes.digest import model_version
from scheduler.lifecycle.inputs import Lifecycle
from scheduler.lifecycle.replica_reports import READY, ReplicaStatus
from scheduler.persistence.versions import definitions_to_record
from scheduler.planner.demands import demands
from scheduler.planner.fleet.placements import Placement
from scheduler.planner.plan import plan
from tests.unit.scheduler.placement_builders import NOW, node


def catalog(args: Sequence[str] = (), priority: int = 0, context: int = 0) -> Catalog:
    raw: dict[str, Any] = {
        "name": "chat",
        "source": "org/chat",
        "scaling": {"min": 2},
        "profiles": [
            {"name": "a100", "gpu_class": "A100", "args": list(args), "priority": priority}
        ],
    }
    if context:
        raw["context_length"] = context
    return Catalog.build([parse_model(raw)], declared=True)


def ready(placements: Sequence[Placement]) -> Lifecycle:
    return Lifecycle(
        statuses={(p.model, p.replica): ReplicaStatus(READY, NOW, NOW) for p in placements}
    )


NODES = [node("n1", gpus=4), node("n2", gpus=4)]


def settle(cat: Catalog, current: Sequence[Placement] = ()) -> tuple[Placement, ...]:
    """Rounds until nothing changes, every replica reporting ready at once."""
    placements = tuple(current)
    for _ in range(20):
        result = plan(demands(cat), NODES, placements, NOW, lifecycle=ready(placements))
        nxt = result.placements
        if nxt == placements and not result.changes_anything:
            return placements
        placements = nxt
    raise AssertionError("the rounds never settled")


def test_a_new_replica_is_pinned_to_the_version_it_was_placed_with() -> None:
    cat = catalog()
    placed = settle(cat)
    (chat,) = cat.models()
    assert len(placed) == 2
    assert {p.version for p in placed} == {model_version(chat)}
    # The round records that version's definition with the placements it writes.
    recorded = definitions_to_record(cat, placed)
    assert list(recorded) == [("chat", model_version(chat))]


def test_a_change_to_what_runs_replaces_the_replicas_with_the_new_version() -> None:
    before = settle(catalog())
    changed = catalog(args=["--max-model-len", "4096"])
    after = settle(changed, before)
    (chat,) = changed.models()
    assert {p.version for p in after} == {model_version(chat)}
    assert not {(p.replica, p.version) for p in after} & {(p.replica, p.version) for p in before}


def test_a_change_that_runs_nothing_new_keeps_every_replica_and_its_pin() -> None:
    """A priority or a context length is not what an engine runs: no rollout, and the
    replicas keep the version they were placed with (its engine view is the same)."""
    before = settle(catalog())
    for changed in (catalog(priority=5), catalog(context=8192)):
        result = plan(demands(changed), NODES, before, NOW, lifecycle=ready(before))
        assert not result.changes_anything
        assert result.placements == before
        assert model_version(changed.models()[0]) not in {p.version for p in before}


def test_a_replica_placed_before_versions_is_pinned_to_the_version_it_runs() -> None:
    cat = catalog()
    placed = settle(cat)
    legacy = tuple(replace(p, version="") for p in placed)
    result = plan(demands(cat), NODES, legacy, NOW, lifecycle=ready(legacy))
    assert not result.place and not result.remove
    assert {p.version for p in result.keep} == {model_version(cat.models()[0])}


@given(st.lists(st.sampled_from(["--a", "--b", "1", "2"]), max_size=4), st.integers(0, 9))
def test_versions_differ_exactly_when_definitions_differ(args: list[str], priority: int) -> None:
    one = catalog(args=args, priority=priority).models()[0]
    same = catalog(args=list(args), priority=priority).models()[0]
    other = catalog(args=[*args, "--c"], priority=priority).models()[0]
    assert model_version(one) == model_version(same)
    assert model_version(one) != model_version(other)
    assert model_version(one) != model_version(
        catalog(args=args, priority=priority + 1).models()[0]
    )
