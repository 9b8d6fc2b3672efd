"""The autoscaler's stored rows read back whatever their bytes (autoscale.store), on real
databases migrated by Alembic (SQLite files and PostgreSQL): a row that cannot be read is
skipped and named (``autoscale.row_skipped``), never an error of the read, so the
autoscaler's rounds, ``llmgw autoscale`` and the backtest go on with the other rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, insert

from autoscale.store import DECISION, AutoscaleStore
from autoscale.tables import DocumentRow, EventRow, RoundRow

AT = datetime(2026, 12, 7, 4, 5, tzinfo=UTC)
# Deeper than Python's JSON parser goes (RecursionError, not ValueError), well within
# the longest body read (1 MiB).
DEEP = ["[" * 100_000, '{"a":' * 100_000, "[" * 50_000 + "]" * 50_000]


@pytest.mark.parametrize("body", DEEP)
def test_a_stored_event_nested_past_the_parser_is_skipped_not_an_error(
    engine: Engine, body: str
) -> None:
    store = AutoscaleStore(engine)
    with engine.begin() as conn:
        for model in ("chat", "embed"):
            conn.execute(
                insert(EventRow).values(
                    type=DECISION, model=model, recorded_at=AT, actor="x", body=body
                )
            )
        store.append(conn, DECISION, "chat", {"wanted": 2}, at=AT)
    assert [e.body for e in store.events()] == [{"wanted": 2}]
    # The last decision of each model: embed's cannot be read (skipped, named).
    assert set(store.latest(DECISION)) == {"chat"}
    assert store.state()["chat"].wanted == 2


@pytest.mark.parametrize("body", DEEP)
def test_a_stored_policy_nested_past_the_parser_skips_its_rounds(engine: Engine, body: str) -> None:
    store = AutoscaleStore(engine)
    with engine.begin() as conn:
        conn.execute(insert(DocumentRow).values(digest="p" * 64, kind="policy", body=body))
        conn.execute(insert(DocumentRow).values(digest="l" * 64, kind="limits", body=body))
        conn.execute(
            insert(RoundRow).values(
                at=AT, policy_digest="p" * 64, limits_digest="l" * 64, changes=0
            )
        )
    assert store.ticks(AT - timedelta(minutes=1), AT + timedelta(minutes=1)) == []
