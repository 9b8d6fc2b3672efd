"""Replay of any log, however damaged, gives a valid catalog in which declared models survive."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import Catalog, CatalogError, parse_model
from events.core.types import CURRENT_SCHEMA, StoredEvent
from events.read.replay import Replayer, replay
from events.write.apply import definition_payload
from tests.support import definition, model

NAMES = ["a", "b", "c", "d", "e", "decl-1", "decl-2", "alias-x"]
DECLARED = Catalog.build(
    [model("decl-1", aliases=["alias-x"]), model("decl-2", fallbacks=["decl-1"])]
)


# The strategies _payload and the logs draw from, built once: made inside each draw, each
# was built and validated again every time (the same strategies, so the same examples).
_KINDS = st.sampled_from(["add", "add", "add", "replace", "remove", "remove", "garbage"])
_NAMES = st.sampled_from(NAMES)
_NAME_LISTS = st.lists(st.sampled_from(NAMES), max_size=2, unique=True)
_COUNTS = st.integers(min_value=0, max_value=30)
_BOOL = st.booleans()
# The garbage a name's event may be, per name (its payloads dumped once, too).
_GARBAGE = {
    name: st.sampled_from(
        [
            ("model.added", "{torn", 1),
            ("model.renamed", "{}", 1),
            ("model.added", json.dumps({"model": definition(name)}), 7),
            ("model.replaced", json.dumps({"model": definition(name)}), 2),
            ("model.removed", "[]", 1),
        ]
    )
    for name in NAMES
}


def _payload(draw: st.DrawFn) -> tuple[str, str, int]:
    kind = draw(_KINDS)
    name = draw(_NAMES)
    if kind in ("add", "replace"):
        extra: dict[str, Any] = {}
        aliases = draw(_NAME_LISTS)
        fallbacks = draw(_NAME_LISTS)
        if draw(_BOOL):
            # An invalid definition: the arithmetic does not add up.
            extra["profiles"] = [{"name": "p", "gpu_class": "A100", "tp": 4, "nodes": 3}]
        body = definition(name, aliases=aliases, fallbacks=fallbacks, **extra)
        if kind == "replace":
            return "model.replaced", json.dumps({"model": body, "declared_digest": None}), 1
        return "model.added", json.dumps({"model": body}), 1
    if kind == "remove":
        return "model.removed", json.dumps({"name": name}), 1
    return draw(_GARBAGE[name])


@st.composite
def logs(draw: st.DrawFn) -> list[StoredEvent]:
    count = draw(_COUNTS)
    when = datetime(2026, 12, 1, tzinfo=UTC)
    events = []
    for position in range(1, count + 1):
        type_, payload, version = _payload(draw)
        events.append(
            StoredEvent(
                position,
                f"e{position}",
                f"c{position}",
                type_,
                version,
                None,
                payload,
                "t",
                "",
                when,
            )
        )
    return events


@settings(max_examples=200, deadline=None)
@given(logs())
def test_replay_of_any_log_gives_a_valid_catalog_where_declared_models_survive(
    events: list[StoredEvent],
) -> None:
    result = replay(DECLARED, events)
    catalog = result.catalog
    # Every declared model survives, exactly as declared.
    for declared in DECLARED.models():
        assert catalog.resolve(declared.name) == declared
        assert catalog.is_declared(declared.name)
    # What replay accepted is a catalog the whole-catalog rules accept.
    rebuilt = Catalog.build(catalog.models(), declared=False)
    assert rebuilt.names() == catalog.names()
    # Every event is accounted for exactly once.
    assert sorted([*result.applied, *(s.position for s in result.skipped)]) == [
        e.position for e in events
    ]
    assert all(s.reason for s in result.skipped)


@settings(max_examples=100, deadline=None)
@given(logs(), st.data())
def test_replay_is_deterministic_and_can_resume_anywhere(
    events: list[StoredEvent], data: st.DataObject
) -> None:
    whole = replay(DECLARED, events)
    assert replay(DECLARED, events) == whole
    # Tailing the log in two reads gives the same state as one full read.
    cut = data.draw(st.integers(min_value=0, max_value=len(events)))
    replayer = Replayer.start(DECLARED)
    replayer.apply_all(events[:cut])
    replayer.apply_all(events[cut:])
    assert replayer.result() == whole


@st.composite
def current_logs(draw: st.DrawFn) -> list[StoredEvent]:
    """Logs as this release writes them (``model.added`` v2 payloads from
    ``definition_payload``, removals v1) mixed with everything ``logs`` draws: what
    ``Replayer.apply_all``'s written-out common cases meet."""
    count = draw(_COUNTS)
    when = datetime(2026, 12, 1, tzinfo=UTC)
    events = []
    for position in range(1, count + 1):
        type_, payload, version = _payload(draw)
        if type_ == "model.added" and payload.startswith('{"model"') and draw(_BOOL):
            body = json.loads(payload)["model"]
            try:
                payload = definition_payload(parse_model(body), None)
            except CatalogError:
                payload = json.dumps({"model": body, "declared_digest": None})
            version = CURRENT_SCHEMA["model.added"]
        events.append(
            StoredEvent(position, f"e{position}", f"c{position}", type_, version, None, payload,
                        "t", "", when)
        )  # fmt: skip
    return events


@settings(max_examples=200, deadline=None)
@given(current_logs(), st.data())
def test_a_log_as_this_release_writes_it_replays_valid_and_resumes_anywhere(
    events: list[StoredEvent], data: st.DataObject
) -> None:
    """The properties above, on logs that take replay's quick steps (version-2 adds as
    ``definition_payload`` writes them, removals), which ``logs`` alone never reaches."""
    whole = replay(DECLARED, events)
    for declared in DECLARED.models():
        assert whole.catalog.resolve(declared.name) == declared
    assert Catalog.build(whole.catalog.models(), declared=False).names() == whole.catalog.names()
    assert sorted([*whole.applied, *(s.position for s in whole.skipped)]) == [
        e.position for e in events
    ]
    cut = data.draw(st.integers(min_value=0, max_value=len(events)))
    resumed = Replayer.start(DECLARED)
    resumed.apply_all(events[:cut])
    resumed.apply_all(events[cut:])
    assert resumed.result() == whole
    assert resumed.result().catalog.models() == whole.catalog.models()
