"""A SQLite cursor that meets text whose bytes are not UTF-8 hands it over as bytes and
goes on: what keeps one edited row from stopping every read (events.database.sqlite_text)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from events.database.sqlite_text import TolerantConnection

BAD = b"\xffA"


def _connection(tmp_path: Path, rows: int, bad_at: set[int]) -> sqlite3.Connection:
    conn = sqlite3.connect(tmp_path / "t.db", factory=TolerantConnection)
    conn.execute("CREATE TABLE t (n INTEGER PRIMARY KEY, s TEXT)")
    for n in range(rows):
        if n in bad_at:
            conn.execute("INSERT INTO t VALUES (?, CAST(? AS TEXT))", (n, BAD))
        else:
            conn.execute("INSERT INTO t VALUES (?, ?)", (n, f"row {n}"))
    conn.commit()
    return conn


def _expected(rows: int, bad_at: set[int]) -> list[tuple[int, str | bytes]]:
    return [(n, BAD if n in bad_at else f"row {n}") for n in range(rows)]


def test_the_plain_driver_fails_the_whole_read_on_one_such_value(tmp_path: Path) -> None:
    # What the project's connections exist to avoid: one value, the whole statement lost.
    _connection(tmp_path, 3, {1}).close()
    plain = sqlite3.connect(tmp_path / "t.db")
    with pytest.raises(sqlite3.OperationalError, match="Could not decode to UTF-8"):
        plain.execute("SELECT n, s FROM t ORDER BY n").fetchall()


@pytest.mark.parametrize("bad_at", [{0}, {4}, {2, 3}, {0, 9}])
def test_every_way_of_fetching_gives_each_row_once_in_order_with_the_value_as_bytes(
    tmp_path: Path, bad_at: set[int]
) -> None:
    conn = _connection(tmp_path, 10, bad_at)
    query = "SELECT n, s FROM t ORDER BY n"
    expected = _expected(10, bad_at)

    assert conn.execute(query).fetchall() == expected
    assert list(conn.execute(query)) == expected
    one = conn.execute(query)
    assert [one.fetchone() for _ in range(11)] == [*expected, None]
    many = conn.execute(query)
    batches = [many.fetchmany(3) for _ in range(5)]
    assert [row for batch in batches for row in batch] == expected
    assert batches[-1] == []
    mixed = conn.execute(query)
    first = [mixed.fetchone(), mixed.fetchone()]
    assert [*first, *mixed.fetchmany(2), *mixed.fetchall()] == expected
    # The connection's own text handling is as it was: str, strict.
    assert conn.text_factory is str


def test_a_cursor_used_again_reads_its_new_statement_not_the_old_rows(tmp_path: Path) -> None:
    conn = _connection(tmp_path, 4, {1})
    cursor = conn.cursor()
    cursor.execute("SELECT n, s FROM t ORDER BY n")
    assert cursor.fetchone() == (0, "row 0")
    assert cursor.fetchone() == (1, BAD)
    cursor.execute("SELECT n FROM t WHERE n >= 2 ORDER BY n")
    assert cursor.fetchall() == [(2,), (3,)]


def test_a_statement_that_writes_is_never_run_twice(tmp_path: Path) -> None:
    conn = _connection(tmp_path, 1, set())
    conn.execute("CREATE TABLE log (s TEXT)")
    cursor = conn.execute("INSERT INTO log VALUES (CAST(? AS TEXT)) RETURNING s", (BAD,))
    with pytest.raises(sqlite3.OperationalError, match="Could not decode to UTF-8"):
        cursor.fetchall()
    cursor.close()
    conn.commit()
    assert conn.execute("SELECT count(*) FROM log").fetchone() == (1,)
