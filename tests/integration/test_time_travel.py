"""``show --at`` and ``diff``: the catalog at any position or time is the replay of that prefix.

``show --at`` starts from the newest usable snapshot at or before the position,
so this is also the property that makes snapshots safe to use for time travel.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, delete

from catalog import Catalog
from catalog.changes.diff import diff_catalogs
from events.catalog_service import CatalogService
from events.core.types import NewEvent
from events.database.tables import EventRow, SnapshotRow
from events.read.replay import replay
from events.read.snapshots import SnapshotStore
from events.read.time_travel import catalog_at, catalogs_at
from events.storage.backends import open_log
from tests.support import definition, model

CONFIG = "deploy/catalog.yaml"
DECLARED = Catalog.build([model("decl", aliases=["d"])])
NAMES = ["a", "b", "c", "d", "decl"]
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


# What `operations` draws, built once: built in the composite, each was a new strategy
# that hypothesis validated again on every draw.
_NAME = st.sampled_from(NAMES)
_KIND = st.sampled_from(["add", "add", "add", "remove", "torn"])
_TP = st.sampled_from([1, 2])
_FALLBACKS = st.lists(st.sampled_from(NAMES), max_size=1)
_STEP = st.integers(min_value=-1, max_value=2)
_BOOL = st.booleans()


@st.composite
def operations(draw: Any) -> tuple[NewEvent, int, bool]:
    """One event as a command or an old release could have written it, the clock's step
    (it may go backwards: the store clamps), and whether a snapshot is taken after it."""
    name = draw(_NAME)
    kind = draw(_KIND)
    if kind == "add":
        body = definition(
            name,
            tp=draw(_TP),
            fallbacks=draw(_FALLBACKS),
        )
        event = NewEvent("model.added", name, json.dumps({"model": body}))
    elif kind == "remove":
        event = NewEvent("model.removed", name, json.dumps({"name": name}))
    else:
        event = NewEvent("model.added", name, "{torn")
    return event, draw(_STEP), draw(_BOOL)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(operations(), min_size=1, max_size=10))
def test_show_at_equals_the_replay_up_to_that_point_for_every_position(
    engine: Engine, ops: list[tuple[NewEvent, int, bool]]
) -> None:
    with engine.begin() as conn:  # each example starts from an empty log
        conn.execute(delete(SnapshotRow))
        conn.execute(delete(EventRow))
    store = open_log(engine)
    snapshots = SnapshotStore(engine)
    when = T0
    for new, step, snapshot in ops:
        when += timedelta(minutes=step)
        store.append([new], expected_head=None, now=when)
        if snapshot:
            CatalogService(store, DECLARED, CONFIG).snapshot()
    events = list(store.read())

    for position in range(len(events) + 1):
        expected = replay(DECLARED, events[:position], CONFIG).catalog
        at, catalog = catalog_at(store, DECLARED, position, config_path=CONFIG, snapshots=snapshots)
        assert at == position
        assert catalog == expected, f"show --at {position}"

    for event in events:
        # A time names the prefix of events recorded at or before it.
        position = store.position_at(event.recorded_at)
        assert position == max(e.position for e in events if e.recorded_at <= event.recorded_at)
        _, catalog = catalog_at(store, DECLARED, position, config_path=CONFIG, snapshots=snapshots)
        assert catalog == replay(DECLARED, events[:position], CONFIG).catalog

    first, last = 0, len(events)
    before, after = catalogs_at(
        store, DECLARED, [last, first], config_path=CONFIG, snapshots=snapshots
    )
    assert before == replay(DECLARED, events, CONFIG).catalog
    assert after == replay(DECLARED, [], CONFIG).catalog
    diff = diff_catalogs(after, before)
    assert set(diff.added) == set(before.names()) - set(after.names())
