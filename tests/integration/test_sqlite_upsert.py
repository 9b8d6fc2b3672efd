"""SQLite's multi-row upsert of node reports stores exactly what one statement per row did.

``scheduler.backend_sqlite`` writes a batch as a few multi-row statements (powers
of two) instead of ``executemany``; the rows stored, as text in the file, must
not differ, whatever the batch's size, its values, or repeated keys in it.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, delete
from sqlalchemy.dialects import sqlite

from events.db import make_engine
from scheduler.backend_sqlite import SQLITE
from scheduler.tables import NodeRow, table

nodes_t = table(NodeRow)
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _row(i: int, micros: int, memory: float | None, gpu_class: str | None) -> dict[str, Any]:
    return {
        "name": f"n{i}",
        "gpu_class": gpu_class,
        "gpus": 8 + i,
        "gpus_reserved": i % 3,
        "memory_gb": memory,
        "labels": f'{{"zone": "z{i % 4}", "\\u00e9": "x"}}',
        "fabric": None if i % 2 else "ib",
        # Microseconds 0 and not: the stored text must keep SQLAlchemy's format.
        "reported_at": T0 + timedelta(seconds=i, microseconds=micros),
    }


def _executemany(engine: Engine, rows: list[dict[str, Any]]) -> None:
    """What ``SqliteBackend.upsert`` did before: one statement, run once per row."""
    stmt = sqlite.insert(nodes_t)
    upsert = stmt.on_conflict_do_update(
        index_elements=[nodes_t.c.name],
        set_={c: stmt.excluded[c] for c in rows[0] if c != "name"},
    )
    with engine.begin() as conn:
        conn.execute(upsert, rows)


def _stored(path: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as raw:
        return raw.execute("SELECT * FROM nodes ORDER BY name").fetchall()


_rows = st.lists(
    st.tuples(
        st.integers(0, 40),  # repeated names: the later row wins
        st.sampled_from([0, 1, 500_000]),
        st.one_of(st.none(), st.floats(0, 4096, allow_nan=False)),
        st.sampled_from([None, "A100", "H100"]),
    ),
    min_size=1,
    max_size=700,  # past the largest statement (256 rows)
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=st.lists(_rows, min_size=1, max_size=3))
def test_a_multi_row_upsert_stores_what_executemany_stored(
    sqlite_url: str, batches: list[list[tuple[int, int, float | None, str | None]]]
) -> None:
    path = sqlite_url.removeprefix("sqlite:///")
    before = path + ".executemany.db"
    with sqlite3.connect(path) as src, sqlite3.connect(before) as dst:
        src.backup(dst)
    ours, theirs = make_engine(sqlite_url), make_engine(f"sqlite:///{before}")
    try:
        for engine in (ours, theirs):
            with engine.begin() as conn:
                conn.execute(delete(nodes_t))
        for batch in batches:
            rows = [_row(*r) for r in batch]
            with ours.begin() as conn:
                SQLITE.upsert(conn, nodes_t, "name", rows)
            _executemany(theirs, rows)
        assert _stored(path) == _stored(before)
        assert {r[0] for r in _stored(path)} == {f"n{i}" for b in batches for i, *_ in b}
    finally:
        ours.dispose()
        theirs.dispose()
