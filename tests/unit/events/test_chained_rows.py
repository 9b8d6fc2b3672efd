"""The ids an append gives its rows: a key's, or fresh random UUIDs, never shared."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from events.core.chain import GENESIS
from events.core.types import NewEvent
from events.storage.log import chained_rows

NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _rows(count: int, key: str | None) -> list[tuple[str, str]]:
    events = [NewEvent("model.added", f"m{i}", "{}") for i in range(count)]
    rows = chained_rows(
        events, head=7, prev_hash=GENESIS, last_time=None, actor="a", reason="", key=key, now=NOON
    )
    return [(event.event_id, event.command_id) for event, _, _ in rows]


@given(st.integers(1, 40))
def test_an_unkeyed_command_gets_a_random_uuid_and_so_does_each_of_its_events(count: int) -> None:
    rows = _rows(count, None)
    (command_id,) = {c for _, c in rows}
    ids = [e for e, _ in rows] + [command_id]
    assert len(set(ids)) == count + 1
    for value in ids:
        parsed = uuid.UUID(value)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and parsed.hex == value
    assert command_id not in {e for e, _ in _rows(count, None)}


def test_a_keyed_command_carries_its_key_as_command_and_first_event_id() -> None:
    assert _rows(3, "deploy-1") == [
        ("deploy-1", "deploy-1"),
        ("deploy-1#2", "deploy-1"),
        ("deploy-1#3", "deploy-1"),
    ]
