"""``usage.recorded``: what a gateway's flush records, how replay and the ledger read it
back (bounded; any other shape is unreadable, skipped and named, never summed), and the
ledger's sums (per client and model, however the counts were split into flushes and
gateways), how the roll-up sums one key's rows, and the version-1 events (one flush's
row) still read."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog import Catalog
from events.core.types import USAGE_RECORDED, NewEvent
from events.core.upcast import UnreadableEvent
from events.core.usage import MAX_COUNT, UsageRow, check_usage, event_for, summed
from events.read.ledger import LedgerQuery, read_row, summarise
from events.read.replay import replay
from events.storage.memory_log import MemoryLog
from tests.support import model

MINUTE = datetime(2026, 12, 7, 4, 5, tzinfo=UTC)
ROW = UsageRow(
    minute=MINUTE,
    client="app-1",
    model="chat",
    served="chat",
    replica="chat/r1",
    requests=3,
    prompt_tokens=90,
    cached_tokens=30,
    completion_tokens=12,
    estimated=1,
    outcomes=(("cancelled", 1), ("ok", 2)),
    gateways=("gw-1-w0",),
    flushes=1,
)


def test_what_replay_reads_back_is_what_was_written() -> None:
    event = event_for(ROW)
    assert event.type == USAGE_RECORDED
    # `history --model chat` lists the model's changes, not its traffic.
    assert event.model == ""
    assert check_usage(json.loads(event.payload)) == ROW
    # Names and counts only: nothing of a prompt or an answer.
    assert set(json.loads(event.payload)) == {
        "gateways", "flushes", "minute", "client", "model", "served", "replica", "requests",
        "outcomes", "prompt_tokens", "cached_tokens", "completion_tokens", "estimated",
    }  # fmt: skip


def _good() -> dict[str, Any]:
    return json.loads(event_for(ROW).payload)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"client": "a b"}, "usage client is not a name"),
        ({"client": "x" * 65}, "usage client is not a name"),
        ({"gateways": [""]}, "usage gateways is not a list"),
        ({"gateways": []}, "usage gateways is not a list"),
        ({"gateways": "gw-1"}, "usage gateways is not a list"),
        ({"gateways": [f"g{i}" for i in range(65)]}, "usage gateways is not a list"),
        ({"flushes": 0}, "usage flushes is not a whole number"),
        ({"gateway": "gw-1"}, "unknown fields"),
        ({"model": ""}, "usage model is not a name"),
        ({"model": "m\n"}, "usage model is not a name"),
        ({"served": None}, "served and replica must both be given"),
        ({"replica": 7}, "usage replica is neither null nor a name"),
        ({"minute": "2026-12-07T04:05:30Z"}, "is not a whole minute in UTC"),
        ({"minute": "2026-12-07T04:05:00+01:00"}, "is not a whole minute in UTC"),
        ({"minute": "2026-12-07T04:05:00"}, "is not a whole minute in UTC"),
        ({"minute": "yesterday"}, "usage minute is not a time"),
        ({"minute": "2" * 41}, "usage minute is not a time"),
        ({"requests": 0, "outcomes": {}, "estimated": 0}, "requests must be at least 1"),
        ({"requests": True}, "usage requests is not a whole number"),
        ({"prompt_tokens": -1}, "usage prompt_tokens is not a whole number"),
        ({"completion_tokens": 1.5}, "usage completion_tokens is not a whole number"),
        ({"completion_tokens": MAX_COUNT + 1}, "usage completion_tokens is not a whole number"),
        ({"cached_tokens": 91}, "cached_tokens is more than its prompt_tokens"),
        ({"estimated": 4}, "usage estimated is more than its requests"),
        ({"outcomes": {"ok": 2}}, "outcomes do not add up to its requests"),
        ({"outcomes": {"OK!": 3}}, "usage outcomes has a name that is not an outcome"),
        ({"outcomes": {"ok": "3"}}, "usage outcomes ok is not a whole number"),
        ({"outcomes": {f"o{'a' * i}": 0 for i in range(17)}}, "at most 16 outcomes"),
        ({"outcomes": [["ok", 3]]}, "usage outcomes is not an object"),
        ({"prompt": "the user's words"}, "unknown fields"),
    ],
)
def test_any_other_shape_is_unreadable_and_named(change: dict[str, Any], reason: str) -> None:
    with pytest.raises(UnreadableEvent, match=reason):
        check_usage({**_good(), **change})


def test_a_payload_that_is_not_an_object_is_unreadable() -> None:
    with pytest.raises(UnreadableEvent, match="not a JSON object"):
        check_usage([1, 2])


def _appended(*events: NewEvent) -> MemoryLog:
    log = MemoryLog()
    for event in events:
        log.append([event], expected_head=None)
    return log


def test_replay_accepts_usage_events_leaves_the_catalog_and_skips_a_bad_one_named() -> None:
    declared = Catalog.build([model("chat")])
    bad = NewEvent(USAGE_RECORDED, "", json.dumps({**_good(), "requests": -5}), 1)
    not_json = NewEvent(USAGE_RECORDED, "", "{not json", 1)
    log = _appended(event_for(ROW), bad, not_json, event_for(ROW))
    result = replay(declared, log.read())
    assert result.applied == (1, 4)
    assert [(s.position, s.type) for s in result.skipped] == [
        (2, USAGE_RECORDED),
        (3, USAGE_RECORDED),
    ]
    assert "usage requests is not a whole number" in result.skipped[0].reason
    assert result.catalog.names() == declared.names()


def test_the_ledger_skips_a_malformed_row_names_it_and_sums_the_rest() -> None:
    bad = NewEvent(USAGE_RECORDED, "", json.dumps({**_good(), "cached_tokens": 10**6}), 1)
    huge = NewEvent(USAGE_RECORDED, "", json.dumps({**_good(), "pad": "x" * (70 << 10)}), 1)
    log = _appended(event_for(ROW), bad, huge, event_for(ROW))
    ledger = summarise(log.read(), LedgerQuery())
    assert ledger.total.completion_tokens == 2 * ROW.completion_tokens
    assert ledger.skipped_count == 2
    assert [s.position for s in ledger.skipped] == [2, 3]
    assert "cached_tokens is more than its prompt_tokens" in ledger.skipped[0].reason
    assert ledger.to_json()["skipped"][0]["position"] == 2


def test_a_version_1_event_one_flush_row_still_reads_as_one_flush_of_its_gateway() -> None:
    v1 = {k: v for k, v in _good().items() if k not in ("gateways", "flushes")}
    old = NewEvent(USAGE_RECORDED, "", json.dumps({**v1, "gateway": "gw-9-w0", "flush": "f"}), 1)
    log = _appended(old, event_for(ROW))
    ledger = summarise(log.read(), LedgerQuery())
    assert not ledger.skipped and ledger.total.requests == 2 * ROW.requests
    assert read_row(next(log.read())).gateways == ("gw-9-w0",)
    bad = NewEvent(USAGE_RECORDED, "", json.dumps({**v1, "flush": "f"}), 1)
    assert (
        "usage gateways is not a list"
        in summarise(_appended(bad).read(), LedgerQuery()).skipped[0].reason
    )


def test_rows_of_one_key_sum_to_one_row_of_every_count_and_gateway() -> None:
    other = replace(ROW, gateways=("gw-2-w0",), requests=1, outcomes=(("ok", 1),), estimated=0)
    one = summed([ROW, other, ROW])
    assert (one.requests, one.flushes, one.gateways) == (7, 3, ("gw-1-w0", "gw-2-w0"))
    assert one.outcomes == (("cancelled", 2), ("ok", 5))
    assert one.prompt_tokens == 3 * ROW.prompt_tokens
    assert check_usage(json.loads(event_for(one).payload)) == one


_rows = st.builds(
    lambda client, model_, minute, served, n, prompt, cached, completion: UsageRow(
        minute=MINUTE + timedelta(minutes=minute),
        client=client,
        model=model_,
        served=model_ if served else None,
        replica=f"{model_}/r1" if served else None,
        requests=n,
        prompt_tokens=prompt,
        cached_tokens=min(cached, prompt),
        completion_tokens=completion,
        outcomes=(("ok", n),),
        gateways=("gw-1-w0",),
    ),
    st.sampled_from(["app-1", "app-2", "batch"]),
    st.sampled_from(["chat", "coder"]),
    st.integers(0, 3000),
    st.booleans(),
    st.integers(1, 5),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
)


@given(st.lists(_rows, max_size=30), st.sampled_from([None, "client", "model", "day"]))
def test_the_ledger_is_the_sum_of_its_rows_in_any_grouping(
    rows: list[UsageRow], by: str | None
) -> None:
    log = _appended(*(event_for(r) for r in rows))
    ledger = summarise(log.read(), LedgerQuery(by=by))
    assert ledger.rows == len(rows) and not ledger.skipped
    for field in ("requests", "prompt_tokens", "cached_tokens", "completion_tokens"):
        want = sum(getattr(r, field) for r in rows)
        assert getattr(ledger.total, field) == want
        assert sum(getattr(g, field) for g in ledger.groups.values()) == want
    # Per client and model, the sum of that pair's rows.
    pairs = summarise(log.read(), LedgerQuery())
    for (client, model_), totals in pairs.groups.items():
        mine = [r for r in rows if (r.client, r.model) == (client, model_)]
        assert totals.completion_tokens == sum(r.completion_tokens for r in mine)
        assert totals.outcomes == {"ok": sum(r.requests for r in mine)}


@given(st.lists(_rows, max_size=20), st.integers(0, 3000), st.sampled_from(["app-1", None]))
def test_the_filters_keep_exactly_the_rows_they_name(
    rows: list[UsageRow], after: int, client: str | None
) -> None:
    since = MINUTE + timedelta(minutes=after, seconds=30)
    log = _appended(*(event_for(r) for r in rows))
    ledger = summarise(log.read(), LedgerQuery(client=client, model="chat", since=since))
    # --since counts whole minutes, from the minute it falls in.
    kept = [
        r
        for r in rows
        if r.model == "chat"
        and (client is None or r.client == client)
        and r.minute >= since.replace(second=0)
    ]
    assert ledger.rows == len(kept)
    assert ledger.total.prompt_tokens == sum(r.prompt_tokens for r in kept)


def test_an_unknown_grouping_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="by must be one of client, model, day"):
        summarise([], LedgerQuery(by="week"))


def test_a_bounded_read_says_it_was_cut_and_where() -> None:
    log = _appended(*(event_for(ROW) for _ in range(5)))
    ledger = summarise(log.read(), LedgerQuery(), max_events=3)
    assert ledger.truncated and ledger.position == 3 and ledger.total.requests == 3 * ROW.requests
    whole = summarise(log.read(), LedgerQuery(), max_events=5)
    assert not whole.truncated and whole.position == 5
