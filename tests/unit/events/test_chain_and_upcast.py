"""The hash chain's canonical form, the verifier's rules, and reading v1 events as v2."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import example, given
from hypothesis import strategies as st

from catalog import Catalog
from events.core.chain import (
    GENESIS,
    ChainRow,
    Seal,
    canonical_bytes,
    canonical_time,
    event_hash,
    verify_chain,
)
from events.core.types import CURRENT_SCHEMA, MODEL_ADDED, StoredEvent
from events.core.upcast import upcast
from events.read.replay import replay
from tests.support import definition

NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_the_canonical_form_is_frozen_and_reproducible_without_llmgw() -> None:
    # What an auditor recomputes by hand: compact JSON, ASCII escapes, UTC time with microseconds.
    literal = (
        '["' + GENESIS + '",1,"e1","c1","model.added",1,"m","{\\"name\\": \\"m\\"}",'
        '"Jos\\u00e9","","2026-12-01T12:00:00.000000Z"]'
    )
    expected = hashlib.sha256(literal.encode("ascii")).hexdigest()
    got = event_hash(
        GENESIS, 1, "e1", "c1", "model.added", 1, "m", '{"name": "m"}', "José", "", NOON
    )
    assert got == expected


# Text as an append hashes it: mostly ASCII (which takes msgspec), the characters where
# the two encoders could differ (quotes, backslashes, control characters, DEL) drawn
# often, and any text (non-ASCII and lone surrogates take json.dumps).
_ASCII = st.text(st.characters(max_codepoint=0x7F), max_size=40)
_TEXT = st.one_of(
    _ASCII,
    st.text(st.sampled_from('"\\\x00\x01\x08\t\n\x0c\r\x1f\x7f a'), max_size=10),
    st.text(max_size=20),
)
_ITEM = st.one_of(
    _TEXT,
    st.none(),
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    st.integers(),
    st.booleans(),
    st.floats(allow_nan=False),
)


@example(["\x7f"])
@example([1 << 64, -(1 << 63) - 1])
@given(st.one_of(st.lists(st.one_of(_TEXT, st.none()), max_size=12), st.lists(_ITEM, max_size=12)))
def test_the_canonical_bytes_are_json_dumps_compact_ascii_whatever_the_values(
    items: list[object],
) -> None:
    # The hash covers json.dumps's bytes; the faster encoder must never write others.
    assert canonical_bytes(items) == json.dumps(items, separators=(",", ":")).encode("ascii")


@given(
    st.lists(_TEXT, min_size=8, max_size=8),
    st.integers(min_value=1, max_value=1 << 70),
    st.integers(min_value=-5, max_value=1 << 64),
    st.one_of(st.none(), _TEXT),
    st.datetimes(timezones=st.just(UTC)),
)
def test_an_event_hash_is_sha256_of_the_frozen_canonical_form(
    texts: list[str], position: int, version: int, model: str | None, at: datetime
) -> None:
    prev, event_id, command_id, type_, payload, actor, reason, _ = texts
    literal = json.dumps(
        [prev, position, event_id, command_id, type_, version, model, payload, actor, reason,
         at.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"],
        separators=(",", ":"),
    )  # fmt: skip
    expected = hashlib.sha256(literal.encode("ascii")).hexdigest()
    got = event_hash(
        prev, position, event_id, command_id, type_, version, model, payload, actor, reason, at
    )
    assert got == expected


def test_recorded_times_hash_the_same_in_any_zone_and_with_zero_microseconds() -> None:
    paris = NOON.astimezone(timezone(timedelta(hours=1)))
    assert canonical_time(paris) == canonical_time(NOON) == "2026-12-01T12:00:00.000000Z"
    assert canonical_time(NOON.replace(microsecond=5)) == "2026-12-01T12:00:00.000005Z"


def _rows(count: int) -> list[ChainRow]:
    rows, prev = [], GENESIS
    for p in range(1, count + 1):
        at = NOON + timedelta(seconds=p)
        h = event_hash(prev, p, f"e{p}", f"c{p}", "model.added", 2, f"m{p}", "{}", "a", "", at)
        rows.append(
            ChainRow(p, f"e{p}", f"c{p}", "model.added", 2, f"m{p}", "{}", "a", "", at, prev, h)
        )
        prev = h
    return rows


def test_a_sound_chain_verifies_and_reports_its_head() -> None:
    rows = _rows(4)
    report = verify_chain(rows, Seal(0, GENESIS, NOON))
    assert report.ok and report.head_position == 4 and report.head_hash == rows[-1].hash
    assert verify_chain([], Seal(0, GENESIS, NOON)).head_hash == GENESIS


def test_the_verifier_names_the_first_position_that_does_not_match() -> None:
    seal = Seal(0, GENESIS, NOON)
    rows = _rows(5)
    edited = [*rows[:2], _replace(rows[2], actor="mallory"), *rows[3:]]
    assert verify_chain(edited, seal).failed_at == 3
    assert verify_chain([*rows[:2], *rows[3:]], seal).failed_at == 3
    assert verify_chain([*rows[:4]], seal, expect_head=rows[4].hash).failed_at == 5
    assert verify_chain(rows, seal, expect_head=rows[1].hash).expected_head_at == 2
    went_back = _replace(rows[3], recorded_at=NOON)
    went_back = _replace(went_back, hash=went_back.computed_hash(rows[2].hash or ""))
    report = verify_chain([*rows[:3], went_back], seal)
    assert report.failed_at == 4
    assert "before the previous event's" in (report.reason or "")


def test_rows_before_the_seal_are_checked_against_it_as_a_whole() -> None:
    rows = [_replace(r, prev_hash=None, hash=None) for r in _rows(3)]
    value = _rows(3)[-1].hash or ""
    assert verify_chain(rows, Seal(3, value, NOON)).ok
    tampered = [rows[0], _replace(rows[1], payload='{"x": 1}'), rows[2]]
    report = verify_chain(tampered, Seal(3, value, NOON))
    assert report.failed_at == 3 and "before the hash chain" in (report.reason or "")
    assert verify_chain(rows[:2], Seal(3, value, NOON)).failed_at == 3


def test_a_v1_add_is_read_as_v2_with_an_unknown_declared_catalog() -> None:
    assert CURRENT_SCHEMA[MODEL_ADDED] == 2
    v1 = {"model": definition("m")}
    assert upcast(MODEL_ADDED, 1, v1) == {**v1, "declared_digest": None}
    assert upcast(MODEL_ADDED, 2, {**v1, "declared_digest": "ab"})["declared_digest"] == "ab"
    # Replay reads both versions to the same model.
    events = [
        StoredEvent(1, "e1", "c1", MODEL_ADDED, 1, "m", json.dumps(v1), "a", "", NOON),
        StoredEvent(
            2, "e2", "c2", MODEL_ADDED, 2, "n",
            json.dumps({"model": definition("n"), "declared_digest": "ab"}), "a", "", NOON,
        ),
    ]  # fmt: skip
    result = replay(Catalog.build([]), events)
    assert result.skipped == () and result.catalog.names() == ["m", "n"]


def _replace(row: ChainRow, **changes: object) -> ChainRow:
    fields = {f: getattr(row, f) for f in ChainRow.__slots__}
    fields.update(changes)
    return ChainRow(**fields)
