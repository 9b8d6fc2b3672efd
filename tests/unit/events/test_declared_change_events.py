"""``catalog.declared_changed``: what a reload records, how replay reads it, and that
logs without it (every log written before) replay exactly as they did."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog import Catalog, parse_model
from events.core.declared_change import check_declared_change, declared_change
from events.core.types import DECLARED_CHANGED, NewEvent
from events.core.upcast import UnreadableEvent
from events.read.model import CatalogReadModel
from events.read.replay import replay
from events.storage.memory_log import MemoryLog
from events.write.commands import CatalogCommands


def model(name: str, arg: str = "") -> Any:
    profile: dict[str, Any] = {"name": "a100", "gpu_class": "A100"}
    if arg:
        profile["args"] = [arg]
    return parse_model({"name": name, "source": f"org/{name}", "profiles": [profile]})


def declared(*models: Any) -> Catalog:
    return Catalog.build(list(models), declared=True)


NAMES = st.sampled_from(["a", "b", "c", "d"])
VERSIONS = st.dictionaries(NAMES, st.sampled_from(["", "--x", "--y"]), max_size=4)


@given(VERSIONS, VERSIONS)
def test_a_change_names_each_model_added_removed_or_changed_once(
    before: dict[str, str], after: dict[str, str]
) -> None:
    old = declared(*(model(n, a) for n, a in before.items()))
    new = declared(*(model(n, a) for n, a in after.items()))
    change = declared_change(old, new, "catalog.yaml")
    assert set(change.added) == after.keys() - before.keys()
    assert set(change.removed) == before.keys() - after.keys()
    assert set(change.changed) == {n for n in before.keys() & after.keys() if before[n] != after[n]}
    if change.models_changed:
        assert change.old_digest != change.new_digest
    # What replay reads back is what was written.
    assert check_declared_change(json.loads(json.dumps(change.payload()))) == change
    assert declared_change(new, new, "catalog.yaml").models_changed is False


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"path": 1, "old_digest": "a", "new_digest": "b"},
        {"path": "p", "old_digest": "a", "new_digest": "b", "added": "x"},
        {"path": "p", "old_digest": "a", "new_digest": "b", "changed": [1]},
        {"path": "p", "old_digest": "a", "new_digest": "b", "removed": ["x"] * 100_001},
    ],
)
def test_a_malformed_payload_is_unreadable(payload: dict[str, Any]) -> None:
    with pytest.raises(UnreadableEvent):
        check_declared_change(payload)


def test_replay_applies_the_event_as_a_record_and_skips_a_malformed_one_by_name() -> None:
    log = MemoryLog()
    commands = CatalogCommands(log, CatalogReadModel(log, declared(model("chat")), "c.yaml"))
    commands.add([model("trial")])
    change = declared_change(declared(model("chat")), declared(model("chat", "--x")), "c.yaml")
    first = commands.record_declared(change, actor="llmgw serve", key="declared-k1")
    again = commands.record_declared(change, actor="llmgw daemon", key="declared-k1")
    assert again.already_recorded and again.events == first.events  # two watchers, one event
    log.append(
        [NewEvent(type=DECLARED_CHANGED, model="", payload='{"path": 3}', schema_version=1)],
        expected_head=2,
    )
    result = replay(declared(model("chat")), log.read())
    assert result.applied == (1, 2)
    (skipped,) = result.skipped
    assert skipped.position == 3 and "path is not text" in skipped.reason
    assert [m.name for m in result.catalog.models()] == ["chat", "trial"]
    (event,) = first.events
    assert event.type == DECLARED_CHANGED and event.model == "chat"
    assert "changed chat" in event.reason


def test_a_newer_version_of_the_event_is_skipped_and_named_not_guessed() -> None:
    log = MemoryLog()
    log.append(
        [NewEvent(type=DECLARED_CHANGED, model="", payload="{}", schema_version=2)],
        expected_head=0,
    )
    (skipped,) = replay(declared(), log.read()).skipped
    assert "newer than this code reads" in skipped.reason


def test_the_read_model_takes_a_new_declared_catalog_and_config_wins_again() -> None:
    log = MemoryLog()
    model_ = CatalogReadModel(log, declared(model("chat")), "c.yaml")
    commands = CatalogCommands(log, model_)
    commands.add([model("trial")])
    assert [m.name for m in model_.catalog().models()] == ["chat", "trial"]
    # The file now declares "trial" too: configuration wins, the runtime add is skipped.
    model_.replace_declared(declared(model("chat"), model("trial", "--x")))
    commands.declared_changed()
    catalog = model_.catalog()
    assert catalog.is_declared("trial")
    trial = catalog.resolve("trial")
    assert trial is not None and trial.profiles[0].args == ("--x",)
    assert len(model_.replayer.skipped) == 1
