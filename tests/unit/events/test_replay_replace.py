"""Replay of model.replaced: the same rules as the commands, the same answer as a rebuild.

A log of additions and replacements, as the commands write it, replays to the
catalog built from each model's final definition (in the order the models were
first added); the fast path reads a replacement exactly as the general path
does; and a replacement that is invalid when replayed is skipped and named,
with the catalog around it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import Catalog, CatalogError, Model
from catalog.changes.digest import catalog_digest
from events.core.types import NewEvent, StoredEvent
from events.read.replay import Replayer, replay
from events.read.replay_reasons import explain, render_context
from events.write.apply import plan_apply
from tests.support import definition, model
from tests.unit.events.test_replay_fast_path import payload_texts

NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DECLARED = Catalog.build([model("decl", aliases=["d"]), model("decl-2", fallbacks=["d"])])
DIGEST = catalog_digest(DECLARED)
NAMES = ["a", "b", "c"]
ALIASES = ["x", "y", "z"]


def _stored(position: int, event: NewEvent) -> StoredEvent:
    return StoredEvent(
        position, f"e{position}", f"c{position}", event.type, event.schema_version,
        event.model, event.payload, "alice", "", NOON,
    )  # fmt: skip


# What `definitions` draws, built once: built in the composite, each was a new strategy
# that hypothesis validated again on every draw.
_NAME = st.sampled_from(NAMES)
_ALIASES = st.lists(st.sampled_from(ALIASES), max_size=2, unique=True)
_FALLBACKS = st.lists(st.sampled_from([*NAMES, *ALIASES, "d"]), max_size=2, unique=True)
_TP = st.sampled_from([1, 2])
_MIN = st.integers(0, 2)


@st.composite
def definitions(draw: st.DrawFn) -> Model:
    name = draw(_NAME)
    return model(
        name,
        aliases=draw(_ALIASES),
        fallbacks=draw(_FALLBACKS),
        tp=draw(_TP),
        scaling={"min": draw(_MIN)},
    )


@settings(max_examples=150, deadline=None)
@given(st.lists(definitions(), max_size=14))
def test_replaying_adds_and_replacements_equals_building_from_the_final_definitions(
    applies: list[Model],
) -> None:
    writer = Replayer.start(DECLARED)
    events: list[StoredEvent] = []
    final: dict[str, Model] = {}  # first-added order, last definition
    for definition_ in applies:
        try:
            plan = plan_apply(writer.state, definition_, DIGEST)
        except CatalogError:
            continue  # refused by the command: nothing written
        for new in plan.events:
            event = _stored(len(events) + 1, new)
            events.append(event)
            assert writer.apply(event) is None
        if plan.outcome != "unchanged":
            final[definition_.name] = definition_
    result = replay(DECLARED, events)
    assert result.skipped == ()
    rebuilt = Catalog.build([*DECLARED.models(), *final.values()])
    assert result.catalog.models() == rebuilt.models()
    assert result.catalog.declared_names == DECLARED.declared_names
    for name in [*NAMES, *ALIASES, "d", "decl", "decl-2"]:
        assert result.catalog.canonical(name) == rebuilt.canonical(name)
        assert result.catalog.fallbacks_of(name) == rebuilt.fallbacks_of(name)


def _outcome(events: list[StoredEvent]) -> tuple[Any, ...]:
    result = replay(DECLARED, events)
    return result.catalog.models(), result.applied, result.skipped


@settings(max_examples=300, deadline=None)
@given(payload_texts())
def test_a_replacement_replays_the_same_through_the_fast_and_the_general_path(text: str) -> None:
    # 'llama' is a runtime model with alias 'a'; 'z' is there to fall back to.
    text = text.replace('"z"', '"d"')
    added = json.dumps({"model": definition("llama", aliases=["a"])})
    events = [
        _stored(1, NewEvent("model.added", "llama", added, 2)),
        _stored(2, NewEvent("model.replaced", "llama", text, 1)),
    ]
    fast = _outcome(events)
    with patch("events.read.replay.decode_definition", return_value=None):
        general = _outcome(events)
    assert fast == general


def _events(*rows: tuple[str, dict[str, Any]]) -> list[StoredEvent]:
    return [
        _stored(i, NewEvent(type_, "", json.dumps(payload), 2 if type_ == "model.added" else 1))
        for i, (type_, payload) in enumerate(rows, start=1)
    ]


def test_a_replacement_of_a_model_declared_since_is_skipped_and_named() -> None:
    events = _events(
        ("model.added", {"model": definition("trial"), "declared_digest": "old"}),
        ("model.replaced", {"model": definition("trial", tp=2), "declared_digest": "old"}),
    )
    declared = Catalog.build([*DECLARED.models(), model("trial")])
    replayer, walk = explain(declared, events, "deploy/catalog.yaml")
    steps = list(walk)
    assert [s.applied for s in steps] == [False, False]
    assert "cannot be replaced at runtime" in (steps[1].reason or "")
    assert "Change it in deploy/catalog.yaml instead" in (steps[1].reason or "")
    assert steps[1].context == {"declared_in": "deploy/catalog.yaml"}
    assert replayer.result().catalog.resolve("trial") == declared.resolve("trial")


def test_a_replacement_that_drops_an_alias_still_in_use_is_skipped_naming_the_dependents() -> None:
    events = _events(
        ("model.added", {"model": definition("trial", aliases=["t"])}),
        ("model.added", {"model": definition("dep", fallbacks=["t"])}),
        ("model.replaced", {"model": definition("trial", fallbacks=["nope"])}),
        ("model.replaced", {"model": definition("trial", aliases=["u"])}),
        ("model.replaced", {"model": definition("ghost")}),
        ("model.replaced", {"model": definition("trial", aliases=["t", "decl-2"])}),
    )
    steps = list(explain(DECLARED, events)[1])
    assert [s.applied for s in steps] == [True, True, False, False, False, False]
    assert steps[2].context["missing_fallbacks"] == ["nope"]
    assert steps[3].context["alias_dependents"] == ["dep"]
    assert "still falling back to dropped alias t: dep" in render_context(steps[3].context)
    assert "nothing to replace" in (steps[4].reason or "")
    assert steps[4].context["models_present"] == ["decl", "decl-2", "trial", "dep"]
    # A collision names the other holder, never the model being replaced itself.
    assert [c["name"] for c in steps[5].context["collides_with"]] == ["decl-2"]
