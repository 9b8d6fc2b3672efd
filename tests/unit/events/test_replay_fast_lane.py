"""Replay's quick steps for the common events judge exactly as the whole way does.

``Replayer.apply`` takes a current add through ``catalog.stored.fast_decode`` and
``CatalogState.add_if_fits``, and a current removal through ``remove_if_allowed``;
``validate`` checks the names of a definition whose other fields passed before in a
few steps (``identifiers.plainly_valid``). Each answers only when sure. Here the same
logs are replayed with every quick step switched off (the decoders answer "not sure",
the names are always checked one by one): the catalog, its indexes, the applied
positions and every skip with its reason must be the same, on logs full of case
collisions, alias clashes, missing fallbacks, removals of what is depended on,
declared names and names the grammar refuses.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from unittest.mock import patch

from hypothesis import example, given, settings
from hypothesis import strategies as st

from catalog import Catalog
from events.core.rows import ReplayEvent
from events.core.types import StoredEvent
from events.read.replay import Replayer
from tests.support import definition, model

NAMES = ["a", "A", "b", "c", "a-latest", "decl-1", "DECL-1", "alias-x", "Alias-X"]
ODD = [" a", "a b", "\u00e9", "x" * 201, "", "-a"]
SOURCES = ["org/x", "org/x@rev2", "", "a\nb", "s" * 1025, " o "]
DECLARED = Catalog.build(
    [model("decl-1", aliases=["alias-x"]), model("decl-2", fallbacks=["decl-1"])]
)


# Mostly names the grammar accepts, so that many events get as far as the catalog.
_NAME = st.sampled_from(NAMES * 4 + ODD)
# The rest of what `_event` draws, built once: built in the composite, each was a new
# strategy that hypothesis validated again on every draw.
_KIND = st.sampled_from(["add", "add", "add", "remove", "remove", "replace"])
_SOME_NAMES = st.lists(_NAME, max_size=2)
_SOURCE = st.sampled_from(SOURCES[:2] * 4 + SOURCES[2:])


STORED = model("template").to_definition()


def _name(draw: st.DrawFn) -> str:
    return draw(_NAME)


@st.composite
def _event(draw: st.DrawFn) -> tuple[str, int, str]:
    kind = draw(_KIND)
    if kind == "remove":
        return "model.removed", 1, json.dumps({"name": _name(draw)})
    # As the commands store a definition (normalised, every key), so that the quick
    # steps are taken, with names, aliases, fallbacks and source drawn: a few of each
    # are refused by the grammar or by the catalog.
    body = {
        **STORED,
        "name": _name(draw),
        "aliases": draw(_SOME_NAMES),
        "fallbacks": draw(_SOME_NAMES),
        "source": draw(_SOURCE),
    }
    payload = json.dumps({"model": body, "declared_digest": None})
    return (
        ("model.replaced" if kind == "replace" else "model.added"),
        (1 if kind == "replace" else 2),
        payload,
    )


_EVENTS = st.lists(_event(), min_size=1, max_size=25)


@st.composite
def _logs(draw: st.DrawFn) -> list[tuple[str, int, str]]:
    return draw(_EVENTS)


def _replay(log: list[tuple[str, int, str]], *, lean: bool) -> Replayer:
    replayer = Replayer.start(DECLARED)
    when = datetime(2026, 12, 1, tzinfo=UTC)
    for position, (type_, version, payload) in enumerate(log, start=1):
        event: Any = (
            ReplayEvent(position, f"e{position}", type_, version, payload)
            if lean
            else StoredEvent(
                position, f"e{position}", "c", type_, version, None, payload, "t", "", when
            )
        )
        replayer.apply(event)
    return replayer


def _outcome(replayer: Replayer) -> tuple[object, ...]:
    state = replayer.state
    return (
        replayer.applied,
        replayer.skipped,
        [m.to_definition() for m in state.snapshot().models()],
        state._index,
        state._folded,
        {k: sorted(v) for k, v in state._dependents.items() if v},
    )


def _add(name: str, **fields: Any) -> tuple[str, int, str]:
    body = {**STORED, "name": name, "source": f"org/{name}", "aliases": [], "fallbacks": []}
    return "model.added", 2, json.dumps({"model": {**body, **fields}, "declared_digest": None})


def _remove(name: str) -> tuple[str, int, str]:
    return "model.removed", 1, json.dumps({"name": name})


@settings(max_examples=500, deadline=None)
@given(_logs())
# Each way a quick step must decline, for certain (random logs find them only now and then).
@example([_add("b"), _add("c", fallbacks=["b"]), _remove("b")])  # depended on
@example([_add("b", aliases=["b-x"]), _add("c", fallbacks=["b-x"]), _remove("b")])
@example([_add("b"), _add("c", aliases=["B"])])  # an alias taken, regardless of case
@example([_add("b"), _add("c", aliases=["c-x", "C-X"])])  # twice in one definition
@example([_add("b"), _add("c", aliases=["C"])])  # its own name again
@example([_add("b"), _add("c", aliases=["a b"])])  # an alias the grammar refuses
@example([_add("b"), _add("c", fallbacks=["a b"])])  # a fallback the grammar refuses
@example([_add("b"), _add("c", source="a\nb")])  # a source that cannot be printed
@example([_add("b"), _add("c", fallbacks=["d"])])  # a fallback not in the catalog
@example([_add("b"), _add("c", fallbacks=["c"]), _remove("c")])  # its own fallback
@example([_add("b"), _remove("alias-x"), _remove("decl-1"), _remove("B"), _remove("b")])
def test_the_quick_steps_judge_every_event_as_the_whole_way_does(
    log: list[tuple[str, int, str]],
) -> None:
    quick = _replay(log, lean=True)
    with (
        patch("events.read.replay.decode_definition", return_value=None),
        patch("events.read.replay.decode_removal", return_value=None),
        patch("catalog.definition.model_rules.plainly_valid", return_value=False),
    ):
        whole = _replay(log, lean=False)

    assert _outcome(quick) == _outcome(whole)


def test_a_log_as_the_commands_write_it_takes_the_quick_steps() -> None:
    """The quick steps are taken (the test above would pass if they never were)."""
    add = json.dumps({"model": definition("m", aliases=["m-latest"]), "declared_digest": None})
    log = [("model.added", 2, add), ("model.removed", 1, json.dumps({"name": "m"}))]
    with (
        patch("catalog.whole.state.CatalogState.check_add", side_effect=AssertionError),
        patch("catalog.whole.state.CatalogState.check_remove", side_effect=AssertionError),
    ):
        replayer = _replay(log, lean=True)

    assert replayer.applied == [1, 2] and replayer.skipped == []
