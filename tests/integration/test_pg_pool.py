"""The suite's PostgreSQL databases are lent again only as the template's copy
(tests/pg_pool.py): every test on PostgreSQL relies on getting a database no earlier test
left anything in, nobody else connected to."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from tests.conftest import PG_ADMIN
from tests.pg_pool import Pool, Template, _children_first

pytestmark = pytest.mark.postgres


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _contents(url: str) -> dict[str, list[str]]:
    """Every table's rows (as JSON, sorted) and every sequence's next value."""
    found: dict[str, list[str]] = {}
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        tables = conn.execute(
            "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
        for (table,) in tables:
            rows = conn.execute(
                sql.SQL("SELECT row_to_json(t)::text FROM {} AS t").format(sql.SQL(table))
            ).fetchall()
            # The seal's time is the template's: the same in every copy.
            found[table] = sorted(r[0] for r in rows)
        sequences = conn.execute(
            "SELECT quote_ident(sequencename) FROM pg_sequences WHERE schemaname = 'public'"
        ).fetchall()
        for (sequence,) in sequences:
            value = conn.execute("SELECT nextval(%s)", (sequence,)).fetchone()
            assert value is not None
            found[f"sequence {sequence}"] = [str(value[0])]
    return found


def _exists(name: str) -> bool:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        return (
            conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            is not None
        )


@pytest.fixture
def pool(pg_template: str) -> Iterator[Pool]:
    pool = Pool(
        PG_ADMIN, pg_template, Template.read(f"postgresql://postgres@127.0.0.1:5432/{pg_template}")
    )
    yield pool
    pool.close()


def _write_everything(url: str) -> None:
    """Rows in tables, the template's own rows changed and gone, sequences moved on."""
    with psycopg.connect(_libpq(url)) as conn:
        conn.execute("UPDATE placement_changes SET seq = seq + 7")
        conn.execute("DELETE FROM event_chain_seal")
        conn.execute(
            "INSERT INTO tokens (issued_at, revision, share, models, priority_class, issued_by,"
            " limits, name, role, sha256, nodes) VALUES (now(), 1, 1, '[]', 'standard', 'x',"
            " '{}', 'leftover', 'reader', 'ab', '[]')"
        )
        conn.execute("SELECT nextval('catalog_snapshots_id_seq')")
        conn.execute("SELECT nextval('autoscale_events_position_seq')")
        conn.commit()


def test_a_database_lent_again_holds_what_a_fresh_copy_holds(pool: Pool) -> None:
    with pool.database() as fresh:
        first = _contents(fresh)
    with pool.database() as url:
        assert url == fresh, "the emptied database is lent again"
        _write_everything(url)
        assert _contents(url) != first
    with pool.database() as again:
        assert again == fresh
        assert _contents(again) == first


def test_a_database_whose_schema_a_test_changed_is_dropped_not_lent(pool: Pool) -> None:
    changes = [
        "CREATE TABLE extra (x int)",
        "ALTER TABLE tokens ADD COLUMN extra int",
        "CREATE INDEX extra_ix ON tokens (name)",
        "CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;"
        " CREATE TRIGGER t BEFORE INSERT ON tokens FOR EACH ROW EXECUTE FUNCTION f()",
        "ALTER TABLE events DISABLE TRIGGER llmgw_notify_events",
        "ALTER TABLE tokens ALTER COLUMN share SET DEFAULT 5",
        "REVOKE ALL ON tokens FROM PUBLIC; GRANT SELECT ON tokens TO PUBLIC",
    ]
    for change in changes:
        with pool.database() as url:
            name = url.rsplit("/", 1)[1]
            with psycopg.connect(_libpq(url), autocommit=True) as conn:
                conn.execute(change)
        assert not _exists(name), change
        assert name not in pool.free, change


def test_a_connection_left_open_is_ended_and_writes_nothing_into_the_next_test(
    pool: Pool,
) -> None:
    with pool.database() as url:
        left = psycopg.connect(_libpq(url))
        # An open transaction holding a lock, as a server killed mid-write leaves.
        left.execute("LOCK TABLE tokens IN ACCESS EXCLUSIVE MODE")
        left.execute("UPDATE placement_changes SET seq = 99")
    try:
        with pool.database() as again:
            assert again == url
            with psycopg.connect(_libpq(again), autocommit=True) as conn:
                seq = conn.execute("SELECT seq FROM placement_changes").fetchone()
                others = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchone()
            assert seq == (0,)
            assert others == (0,)
        with pytest.raises(psycopg.OperationalError):
            left.execute("SELECT 1")
    finally:
        left.close()


def test_tables_are_emptied_children_before_the_tables_they_refer_to() -> None:
    names = {1: "a", 2: "b", 3: "c", 4: "d"}
    # c refers to b, b to a; d alone; a cycle between nothing else.
    refers = {1: set(), 2: {1}, 3: {2}, 4: set()}
    order = _children_first(names, refers)
    assert sorted(order) == ["a", "b", "c", "d"]
    assert order.index("c") < order.index("b") < order.index("a")
