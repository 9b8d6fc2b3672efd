"""Explained replay: each event applied or skipped, and a skip shown with the catalog around it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from catalog import Catalog
from catalog.changes.digest import catalog_digest
from events.core.types import StoredEvent
from events.read.replay import replay
from events.read.replay_reasons import Step, explain, render_context
from tests.support import definition, model

NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DECLARED = Catalog.build([model("llama-70b", aliases=["llama"]), model("qwen-7b")])


def _events(*rows: tuple[str, Any] | tuple[str, Any, int]) -> list[StoredEvent]:
    out = []
    for position, row in enumerate(rows, start=1):
        type_, payload, *version = row
        text = payload if isinstance(payload, str) else json.dumps(payload)
        out.append(
            StoredEvent(
                position, f"e{position}", f"c{position}", type_, version[0] if version else 1,
                None, text, "alice", "", NOON,
            )
        )  # fmt: skip
    return out


def _steps(events: list[StoredEvent], declared: Catalog = DECLARED) -> list[Step]:
    replayer, steps = explain(declared, events, "deploy/catalog.yaml")
    walked = list(steps)
    # The walk is the replay: same outcome, event for event.
    assert replayer.result() == replay(declared, events, "deploy/catalog.yaml")
    return walked


def test_every_event_is_one_step_applied_or_skipped_with_its_reason() -> None:
    steps = _steps(
        _events(
            ("model.added", {"model": definition("trial")}),
            ("model.added", "{torn"),
            ("model.removed", {"name": "trial"}),
        )
    )
    assert [(s.position, s.applied) for s in steps] == [(1, True), (2, False), (3, True)]
    assert steps[1].reason is not None and "not valid JSON" in steps[1].reason
    assert steps[1].context == {"payload": "{torn"}
    assert steps[0].to_json()["outcome"] == "applied" and "reason" not in steps[0].to_json()


def test_a_collision_names_what_already_held_the_name_or_alias() -> None:
    steps = _steps(
        _events(
            ("model.added", {"model": definition("trial", aliases=["t"])}),
            ("model.added", {"model": definition("other", aliases=["llama", "t"])}),
        )
    )
    skipped = steps[1]
    assert not skipped.applied
    assert skipped.context["collides_with"] == [
        {"name": "llama", "held_by": "llama-70b", "as": "alias", "declared": True},
        {"name": "t", "held_by": "trial", "as": "alias", "declared": False},
    ]
    lines = render_context(skipped.context)
    assert "collides with: llama, an alias of declared model llama-70b" in lines


def test_a_missing_fallback_shows_the_models_present_and_the_closest_names() -> None:
    steps = _steps(_events(("model.added", {"model": definition("x", fallbacks=["qwen7b"])})))
    context = steps[0].context
    assert context["missing_fallbacks"] == ["qwen7b"]
    assert context["similar"][0] == "qwen-7b"
    assert context["models_present"] == ["llama-70b", "qwen-7b"]
    assert "models present (2): llama-70b, qwen-7b" in render_context(context)


def test_a_refused_removal_shows_what_was_there_and_what_still_depends_on_it() -> None:
    steps = _steps(
        _events(
            ("model.added", {"model": definition("base")}),
            ("model.added", {"model": definition("child", fallbacks=["base"])}),
            ("model.removed", {"name": "base"}),
            ("model.removed", {"name": "qwen-7b"}),
            ("model.removed", {"name": "bsae"}),
        )
    )
    assert steps[2].context == {"dependents": ["child"]}
    assert steps[3].context == {"declared_in": "deploy/catalog.yaml"}
    assert steps[4].context["similar"] == ["base"]
    assert steps[4].context["models_present_count"] == 4


def test_a_v2_add_says_whether_the_declared_catalog_changed_since_it_was_written() -> None:
    before = Catalog.build([model("base")])
    now = Catalog.build([model("base"), model("trial")])
    payload = {"model": definition("trial"), "declared_digest": catalog_digest(before)}
    (step,) = _steps(_events(("model.added", payload, 2)), declared=now)
    assert not step.applied
    assert step.context["declared_changed_since"] is True
    assert "the declared configuration changed since this event was written" in render_context(
        step.context
    )
    same = {"model": definition("base"), "declared_digest": catalog_digest(now)}
    (step,) = _steps(_events(("model.added", same, 2)), declared=now)
    assert step.context["declared_changed_since"] is False
