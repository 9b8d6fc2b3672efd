"""The usage roll-up on real databases (SQLite files and PostgreSQL): a gateway's flush is
stored pending, once however often it is sent; every closed minute's pending rows of all
gateways become one ``usage.recorded`` event per key, summed, and leave the table in the
same transaction; a late flush adds one more event; a row that cannot be read is left,
skipped and named; and two real `llmgw serve` processes on one PostgreSQL rolling up at
once never count a row twice."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert, select

from catalog import Catalog
from events.core.types import USAGE_RECORDED
from events.core.usage import MAX_COUNT, UsageRow
from events.database.connection import make_engine
from events.database.tables import UsagePendingRow
from events.read.ledger import LedgerQuery, read_row, summarise
from events.storage.backends import open_log
from events.storage.history import usage_events
from events.storage.usage_pending import pending_rows
from events.write.usage import GRACE, closed_before, record_usage, roll_up
from llmgw.api.runtime import usage_rollup
from llmgw.api.runtime.services import Services
from llmgw.api.runtime.settings import ApiSettings
from tests.api.server import ApiServer

MINUTE = datetime(2026, 12, 7, 4, 5, tzinfo=UTC)
# A time at which MINUTE is closed (its end and the grace past).
LATER = MINUTE + timedelta(minutes=1) + GRACE
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
    outcomes=(("ok", 3),),
)
OTHER = replace(ROW, client="app-2", requests=1, prompt_tokens=5, cached_tokens=0,
                completion_tokens=1, outcomes=(("ok", 1),))  # fmt: skip


def _ledger(engine: Engine, by: str | None = None) -> dict[str, Any]:
    return summarise(
        usage_events(engine), LedgerQuery(by=by), pending=pending_rows(engine)
    ).to_json()


def _events(engine: Engine) -> list[UsageRow]:
    return [read_row(e) for e in usage_events(engine)]


def _pending(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(UsagePendingRow)).scalar_one())


def test_a_minute_is_closed_after_its_end_and_the_grace() -> None:
    assert closed_before(LATER - timedelta(microseconds=1)) == MINUTE
    assert closed_before(LATER) == MINUTE + timedelta(minutes=1)


def test_a_flush_sent_again_is_stored_once_even_after_its_minute_was_rolled_up(
    engine: Engine,
) -> None:
    assert record_usage(engine, "gw-1-w0", "abc", [ROW, OTHER])
    assert not record_usage(engine, "gw-1-w0", "abc", [ROW, OTHER])
    assert _pending(engine) == 2
    # Counted at once, before any roll-up: the ledger reads the pending rows too.
    assert _ledger(engine)["total"]["requests"] == 4
    roll_up(open_log(engine), LATER)
    assert not record_usage(engine, "gw-1-w0", "abc", [ROW, OTHER])
    assert _pending(engine) == 0
    # Another gateway's flush of the same id is its own.
    assert record_usage(engine, "gw-2-w0", "abc", [ROW])
    assert _ledger(engine)["total"]["requests"] == 7


def test_two_gateways_flushes_of_a_minute_are_one_event_per_key(engine: Engine) -> None:
    store = open_log(engine)
    head = store.head()
    for gateway in ("gw-1-w0", "gw-2-w0"):
        for flush in ("f1", "f2", "f3"):
            record_usage(engine, gateway, flush, [ROW, OTHER])
    before = _ledger(engine)
    # The open minute (and its grace) is left pending.
    assert roll_up(store, LATER - timedelta(seconds=1)).events == 0
    done = roll_up(store, LATER)
    assert (done.rows, done.events) == (12, 2) and store.head() == head + 2
    assert _pending(engine) == 0
    events = sorted(_events(engine), key=lambda r: r.client)
    assert [(e.client, e.requests, e.flushes, e.gateways) for e in events] == [
        ("app-1", 18, 6, ("gw-1-w0", "gw-2-w0")),
        ("app-2", 6, 6, ("gw-1-w0", "gw-2-w0")),
    ]
    assert events[0].prompt_tokens == 6 * ROW.prompt_tokens
    # The ledger is the same before and after: only where the counts live moved.
    after = _ledger(engine)
    assert (after["groups"], after["total"]) == (before["groups"], before["total"])
    assert (before["pending"], after["pending"], after["rows"]) == (12, 0, 2)
    assert roll_up(store, LATER).events == 0  # nothing twice


def test_a_late_flush_of_a_rolled_minute_is_one_more_event_summed_on_reading(
    engine: Engine,
) -> None:
    store = open_log(engine)
    record_usage(engine, "gw-1-w0", "f1", [ROW])
    roll_up(store, LATER)
    record_usage(engine, "gw-2-w0", "late", [ROW])
    assert roll_up(store, LATER + timedelta(minutes=5)).events == 1
    assert [e.requests for e in _events(engine)] == [3, 3]
    groups = _ledger(engine)["groups"]
    assert [(g["client"], g["requests"]) for g in groups] == [("app-1", 6)]


def test_a_hostile_pending_row_is_left_skipped_and_named_and_the_rest_rolled_up(
    engine: Engine,
) -> None:
    store = open_log(engine)
    record_usage(engine, "gw-1-w0", "f1", [ROW])
    good = {k: v for k, v in json.loads(json.dumps(ROW.payload())).items()
            if k not in ("gateways", "flushes")}  # fmt: skip
    with engine.begin() as conn:
        for poster, row in (
            ("gw-1-w0", "{not json"),
            ("gw-1-w0", json.dumps({**good, "requests": -1})),
            ("gw-1-w0", json.dumps({**good, "gateways": ["forged"]})),
            ("gw-1-w0", json.dumps([1, 2])),
        ):
            conn.execute(
                insert(UsagePendingRow).values(
                    poster=poster, flush="x", minute=MINUTE, row=row, received_at=MINUTE
                )
            )
    done = roll_up(store, LATER)
    assert (done.rows, done.events) == (1, 1)
    assert [s.name.split(":")[0] for s in done.skipped] == ["usage_pending"] * 4
    assert "requests is not a whole number" in done.skipped[1].reason
    assert _pending(engine) == 4  # left for an operator to look at, never summed
    ledger = _ledger(engine)
    assert ledger["total"]["requests"] == 3
    assert ledger["skipped_count"] == 4
    assert ledger["skipped"][0]["event_id"] == done.skipped[0].name
    assert roll_up(store, LATER).events == 0


@pytest.mark.slow
def test_two_serve_processes_rolling_up_at_once_on_postgres_never_double_count(
    pg_url: str, tmp_path: Path
) -> None:
    engine = make_engine(pg_url)
    env = {"LLMGW_USAGE_ROLLUP_S": "0.05"}
    servers = [ApiServer(tmp_path, pg_url, declared=None, env=env) for _ in range(2)]
    old = datetime.now(UTC) - timedelta(minutes=10)
    sent = 0
    try:
        for server in servers:
            server.start()
        for i in range(150):  # flushes arriving while both roll up
            minute = old + timedelta(minutes=i % 3)
            row = replace(ROW, minute=minute.replace(second=0, microsecond=0), requests=1 + i % 4,
                          outcomes=(("ok", 1 + i % 4),))  # fmt: skip
            record_usage(engine, f"gw-{i % 5}-w0", f"f{i}", [row, OTHER])
            sent += row.requests + OTHER.requests
        deadline = time.monotonic() + 60
        while _pending(engine) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _pending(engine) == 0
    finally:
        for server in servers:
            server.stop()
    events = _events(engine)
    assert sum(e.requests for e in events) == sent
    assert sum(e.flushes for e in events) == 300
    rolled = [s.log_path.read_text().count("api.usage_rolled_up") for s in servers]
    assert sum(rolled) >= 1, rolled
    assert all(e.type == USAGE_RECORDED for e in usage_events(engine))
    engine.dispose()


def _unreadable(engine: Engine, n: int) -> None:
    with engine.begin() as conn:
        for i in range(n):
            conn.execute(
                insert(UsagePendingRow).values(
                    poster="gw-1-w0", flush=f"bad{i}", minute=MINUTE, row="{not json",
                    received_at=MINUTE,
                )
            )  # fmt: skip


def test_unreadable_rows_however_many_never_hold_back_the_rows_behind_them(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Five rows no pass can read, then a good flush (ids after theirs). A pass reads at
    # most MAX_PASS rows (three here): the unreadable ones filled every pass, from the
    # first row again each time, and the good one behind them was never summed.
    _unreadable(engine, 5)
    record_usage(engine, "gw-1-w0", "f1", [ROW])
    store = open_log(engine)
    first = roll_up(store, LATER, most=3)
    assert (first.read, first.rows, len(first.skipped)) == (3, 0, 3)
    assert roll_up(store, LATER, most=3).rows == 0  # from the start: the same three
    on = roll_up(store, LATER, after=first.last_id, most=3)
    assert (on.read, on.rows, len(on.skipped)) == (3, 1, 2)
    # The server's roll-up goes on from where a whole pass stopped.
    _unreadable(engine, 4)
    record_usage(engine, "gw-1-w0", "f2", [OTHER])
    monkeypatch.setattr(usage_rollup, "MAX_PASS", 3)
    services = Services.build(engine, Catalog.build([]), "catalog.yaml", ApiSettings())
    usage_rollup.UsageRollup(services, interval=60)._pass(LATER)
    assert _pending(engine) == 9  # the unreadable, left for an operator, named
    assert sorted(r.client for r in _events(engine)) == ["app-1", "app-2"]


def test_a_hostile_gateways_huge_counts_never_make_a_minutes_usage_unreadable(
    engine: Engine,
) -> None:
    """A gateway token that flushes counts at the bound (``MAX_COUNT``) for a client's key
    twice must not make the summed event one that replay refuses (its sum past the
    bound): that would drop every gateway's counts of the key, the honest ones with it (a
    client's usage erased), at every roll-up of it. The roll-up sums a key's rows into as
    many events as keep each within the bound."""
    huge = replace(ROW, requests=MAX_COUNT, prompt_tokens=MAX_COUNT, cached_tokens=MAX_COUNT,
                   completion_tokens=MAX_COUNT, estimated=MAX_COUNT,
                   outcomes=(("ok", MAX_COUNT),))  # fmt: skip
    # And outcomes of its own naming: 16 a row (the most), 32 in the key's sum.
    named = [replace(ROW, requests=16, outcomes=tuple((f"{p}_{chr(97 + i)}", 1) for i in range(16)))
             for p in ("a", "b")]  # fmt: skip
    store = open_log(engine)
    record_usage(engine, "gw-1-w0", "f1", [ROW])
    record_usage(engine, "gw-evil-w0", "f1", [huge])
    record_usage(engine, "gw-evil-w0", "f2", [huge, *named])
    done = roll_up(store, LATER)
    assert done.rows == 5 and not done.skipped and _pending(engine) == 0
    events = _events(engine)  # every one readable (read_row raises otherwise)
    total = 2 * MAX_COUNT + ROW.requests + 32
    assert sum(e.requests for e in events) == total
    assert all(e.requests <= MAX_COUNT and len(e.outcomes) <= 16 for e in events)
    ledger = _ledger(engine)
    assert ledger["total"]["requests"] == total
    assert ledger["skipped_count"] == 0
