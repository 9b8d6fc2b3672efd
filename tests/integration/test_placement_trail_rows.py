"""The placement trail's ``nodes`` column read back whatever its bytes, on real databases
migrated by Alembic (SQLite files and PostgreSQL): the two readers that decode it alone
(``nodes_named_after``, which the placement generations follow every second, and
``moves_between``, which keeps the hosted counts) take a text they cannot read as "not
known" (a generation reset; the counts read whole), never an error."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, insert

from scheduler.persistence.audit_trail import PLACED, moves_between, nodes_named_after
from scheduler.persistence.tables import PlacementEventRow

AT = datetime(2026, 12, 7, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    "nodes", ["[" * 100_000, '{"a":' * 100_000, "[" * 50_000 + "]" * 50_000, "not json"]
)
def test_a_trail_rows_nodes_nested_past_the_parser_are_not_known_never_an_error(
    engine: Engine, nodes: str
) -> None:
    with engine.begin() as conn:
        for position, text in ((1, '["node-1"]'), (2, nodes), (3, '["node-2"]')):
            conn.execute(
                insert(PlacementEventRow).values(
                    position=position,
                    round_id=1,
                    type=PLACED,
                    model="chat",
                    replica=0,
                    profile="p",
                    nodes=text,
                    reason="",
                    catalog_position=1,
                    recorded_at=AT,
                )
            )
    with engine.connect() as conn:
        assert nodes_named_after(conn, after=0, limit=10) == [
            (1, ("node-1",)),
            (2, None),
            (3, ("node-2",)),
        ]
        assert moves_between(conn, after_round=0, through_round=1) is None
