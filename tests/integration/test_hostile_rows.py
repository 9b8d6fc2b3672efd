"""A stored row that cannot be read is a skip with position and reason, for every reader,
on both stores: never a RecursionError, a TypeError or a start-up that stops."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, Table, delete, insert
from structlog.testing import capture_logs

from catalog import Catalog
from events.audit.adoption import verify_log
from events.database.connection import make_engine
from events.database.tables import EventRow
from events.read.replay import Replayer, replay
from events.read.snapshots import Restored, SnapshotStore
from events.storage.backends import open_log
from events.storage.history import HistoryQuery, history
from tests.api.server import ApiServer, running
from tests.e2e.cli import Cli
from tests.hostile.documents import deep_json_array
from tests.support import definition, insert_raw_event, not_utf8, raw_value_mark


def _deep_then_valid(engine: Engine) -> None:
    insert_raw_event(engine, 1, payload=deep_json_array(2000), schema_version=2, model="deep")
    insert_raw_event(engine, 2, payload={"model": definition("after")}, model="after")


def test_a_2000_deep_payload_is_skipped_and_named_by_replay(engine: Engine) -> None:
    _deep_then_valid(engine)

    result = replay(Catalog.build([]), open_log(engine).read())

    assert result.catalog.names() == ["after"]
    (skipped,) = result.skipped
    assert skipped.position == 1
    assert "nested deeper than 32 levels" in skipped.reason


def test_every_command_reads_past_a_2000_deep_payload(
    tmp_path: Path, db_url: str, engine: Engine
) -> None:
    _deep_then_valid(engine)
    cli = Cli(tmp_path, db_url)

    assert [m["name"] for m in cli.json("models")] == ["after"]
    added = cli("add", cli.write("new.yaml", definition("new")))
    assert added.returncode == 0, added.stderr
    explained = cli("replay", "--explain", "--json")
    assert explained.returncode == 0, explained.stderr
    steps = json.loads(explained.stdout)
    steps = steps["events"]
    assert steps[0]["outcome"] == "skipped" and steps[0]["position"] == 1
    assert "nested deeper than 32 levels" in steps[0]["reason"]
    assert [s["outcome"] for s in steps[1:]] == ["applied", "applied"]

    with running(ApiServer(tmp_path, db_url, declared=None)) as server, server.client() as c:
        assert c.get("/healthz").status_code == 200
    assert server.logs("api.catalog_ready")[0]["models"] == 2


def test_a_sqlite_row_with_columns_of_the_wrong_type_is_skipped_and_named(
    sqlite_url: str,
) -> None:
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO events (position, event_id, command_id, type, schema_version, model,"
            " payload, actor, reason, recorded_at) VALUES"
            " (1, 'e1', 'c1', 'model.added', 'two', NULL, X'FF00', 'a', '', 'yesterday')"
        )
    insert_raw_event(engine, 2, payload={"model": definition("after")}, model="after")

    result = replay(Catalog.build([]), open_log(engine).read())
    engine.dispose()

    assert result.catalog.names() == ["after"]
    (skipped,) = result.skipped
    assert skipped.position == 1 and "recorded_at 'yesterday' is not a time" in skipped.reason


def test_history_and_verify_name_a_row_with_columns_of_the_wrong_type(
    sqlite_url: str, tmp_path: Path
) -> None:
    """`llmgw history` read rows through SQLAlchemy's type processors, which raised on a
    recorded_at that is not a time: a traceback instead of the audit trail. It now reads
    them as replay does, and the bad row is listed with its reason."""
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO events (position, event_id, command_id, type, schema_version, model,"
            " payload, actor, reason, recorded_at) VALUES"
            " (1, 'e1', 'c1', 'model.added', 'two', NULL, X'FF00', 'a', '', 'yesterday')"
        )
    insert_raw_event(engine, 2, payload={"model": definition("after")}, model="after")
    engine.dispose()
    cli = Cli(tmp_path, sqlite_url)
    listed = cli("history")
    assert listed.returncode == 0, listed.stderr
    first, second = listed.stdout.splitlines()[1:3]
    assert (
        first.startswith("1 ") and "unreadable row: recorded_at 'yesterday' is not a time" in first
    )
    assert second.startswith("2 ") and "after" in second
    as_json = cli.json("history")
    assert [e["position"] for e in as_json] == [1, 2]
    # verify read the chain through the same processors: a traceback, not a finding.
    verified = cli("verify")
    assert verified.returncode == 1 and "Traceback" not in verified.stderr
    assert "verify failed at position 1: the row cannot be read (recorded_at 'yesterday'" in (
        verified.stderr
    )


# What a column of each store accepts: anything at all in SQLite (a value of any
# type in any column), text without NUL and integers of the column's range in
# PostgreSQL, whose text columns cannot hold NUL.
def _pg_text() -> st.SearchStrategy[str]:
    structured = st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
        max_leaves=8,
    ).map(json.dumps)
    deep = st.integers(0, 3000).map(deep_json_array)
    wrapped = st.builds(lambda d: json.dumps({"model": d}), st.dictionaries(st.text(), st.text()))
    return (st.text(max_size=30) | structured | deep | wrapped).map(lambda s: s.replace("\0", ""))


def _any_value() -> st.SearchStrategy[Any]:
    # What SQLite can hold: NaN is stored as NULL (which NOT NULL refuses), integers are 64-bit.
    scalars = st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
    # Bytes as a BLOB, and as TEXT that is not UTF-8 (tests.support.NotUtf8).
    undecodable = st.binary(max_size=19).map(not_utf8)
    return st.none() | scalars | st.binary(max_size=20) | undecodable | _pg_text()


COLUMNS = (
    "event_id",
    "command_id",
    "type",
    "schema_version",
    "model",
    "payload",
    "actor",
    "reason",
)

# What `_rows` draws, built once: built in the composite, each was a new strategy that
# hypothesis validated again on every draw.
_PG_TEXT = _pg_text()
_ANY_VALUE = _any_value()
_UUID = st.uuids()
_TYPE = st.sampled_from(["model.added", "model.removed", "other"])
_VERSION = st.integers(-1, 3)
_PG_VERSION = st.integers(-(2**31), 2**31 - 1)
_ODD_COLUMNS = st.lists(st.sampled_from(COLUMNS), max_size=3, unique=True)
_BOOL = st.booleans()


@st.composite
def _rows(draw: st.DrawFn, backend: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "event_id": draw(_UUID).hex,
        "command_id": "c",
        "type": draw(_TYPE),
        "schema_version": draw(_VERSION),
        "model": None,
        "payload": draw(_PG_TEXT),
        "actor": "a",
        "reason": "",
        "recorded_at": datetime(2026, 1, 1, tzinfo=UTC),
    }
    if backend == "sqlite":
        for column in draw(_ODD_COLUMNS):
            value = draw(_ANY_VALUE)
            if value is None and column != "model":
                continue  # NOT NULL is enforced even by SQLite
            row[column] = value
        if draw(_BOOL):
            row["recorded_at"] = draw(_PG_TEXT)
    else:
        row["schema_version"] = draw(_PG_VERSION)
        row["type"] = draw(_PG_TEXT)[:64]
    return row


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_value_in_any_column_of_a_stored_row_stops_replay(
    engine: Engine, data: st.DataObject
) -> None:
    backend = engine.dialect.name
    rows = data.draw(st.lists(_rows(backend), min_size=1, max_size=4))
    # SQLAlchemy types __table__ as a FromClause; a declarative table is a Table.
    table: Table = EventRow.__table__  # type: ignore[assignment]
    with engine.begin() as conn:
        conn.execute(delete(table))
        seen: set[object] = set()
        for position, row in enumerate(rows, start=1):
            values = {**row, "position": position}
            if values["event_id"] in seen:
                # Two rows with one id are refused by the table itself (UNIQUE), not replay's
                # concern: give the later one an id of its own.
                values["event_id"] = f"dup-{position}"
            seen.add(values["event_id"])
            if backend == "sqlite":
                # Raw SQL: values go in as they are, past every type processor.
                names = ", ".join(values)
                marks = ", ".join(raw_value_mark(k, v) for k, v in values.items())
                conn.exec_driver_sql(
                    f"INSERT INTO events ({names}) VALUES ({marks})",
                    {
                        k: (v.isoformat() if isinstance(v, datetime) else v)
                        for k, v in values.items()
                    },
                )
            else:
                conn.execute(insert(table), values)
        conn.execute(insert(table), {**_valid(len(rows) + 1)})

    result = replay(Catalog.build([]), open_log(engine).read())
    # Start-up's lean read (events.core.rows.ReplayEvent) judges every row the same way.
    lean = replay(Catalog.build([]), open_log(engine).read_for_replay())

    assert result.position == len(rows) + 1
    assert "survivor" in result.catalog.names()
    assert all(s.reason for s in result.skipped)
    assert (lean.applied, lean.skipped, lean.catalog.names()) == (
        result.applied,
        result.skipped,
        result.catalog.names(),
    )


def _raw(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _valid(position: int) -> dict[str, Any]:
    return {
        "position": position,
        "event_id": f"valid-{position}",
        "command_id": "v",
        "type": "model.added",
        "schema_version": 2,
        "model": "survivor",
        "payload": json.dumps({"model": definition("survivor"), "declared_digest": None}),
        "actor": "a",
        "reason": "",
        "recorded_at": datetime(2026, 1, 2, tzinfo=UTC),
    }


def test_a_snapshot_that_cannot_be_read_is_ignored_named_and_replay_takes_over(
    sqlite_url: str,
) -> None:
    engine = make_engine(sqlite_url)
    insert_raw_event(engine, 1, payload={"model": definition("kept")}, model="kept")
    replayer = Replayer.start(Catalog.build([]))
    replayer.apply_all(open_log(engine).read())
    snapshots = SnapshotStore(engine)
    snapshots.save(replayer, Catalog.build([]))
    with engine.begin() as conn:  # a BLOB where the models' JSON text belongs
        conn.exec_driver_sql("UPDATE catalog_snapshots SET models = X'5B5D'")

    with capture_logs() as logs:
        restored = snapshots.load(Catalog.build([]))
    engine.dispose()

    assert restored == Restored(None, ignored=True)
    (ignored,) = [e for e in logs if e["event"] == "catalog.snapshot_ignored"]
    # Named either way: the checksum, taken over the bytes as stored, no longer matches
    # (or, where a checksum passes, the models cannot be decoded).
    assert "cannot be read" in ignored["reason"] or "checksum mismatch" in ignored["reason"]


EVENT_TEXT_COLUMNS = (
    "event_id",
    "command_id",
    "type",
    "model",
    "payload",
    "actor",
    "reason",
    "recorded_at",
    "prev_hash",
    "hash",
)


@pytest.mark.parametrize("column", EVENT_TEXT_COLUMNS)
def test_text_that_is_not_utf8_in_any_column_is_named_by_every_reader_of_the_log(
    sqlite_url: str, column: str
) -> None:
    """SQLite keeps whatever bytes it is given as TEXT, and the driver's fetch of such a
    value failed the whole read: `llmgw models`, `history`, `verify` and start-up stopped
    on one edited row. Now the value reads as bytes and its row is named."""
    engine = make_engine(sqlite_url)
    insert_raw_event(engine, 1, payload={"model": definition("edited")}, model="edited")
    insert_raw_event(engine, 2, payload={"model": definition("after")}, model="after")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"UPDATE events SET {column} = CAST(? AS TEXT) WHERE position = 1",
            (bytes(not_utf8(b"A")),),
        )
    log = open_log(engine)

    whole = replay(Catalog.build([]), log.read())
    lean = replay(Catalog.build([]), log.read_for_replay())
    listed = list(history(engine, HistoryQuery()))
    verified = verify_log(log)
    engine.dispose()

    assert [e.position for e in listed] == [1, 2]
    assert (verified.ok, verified.failed_at) == (False, 1)
    if column in ("prev_hash", "hash"):
        # Replay does not read the chain's columns; verify names the row.
        assert whole.catalog.names() == ["after", "edited"]
        return
    assert whole.catalog.names() == ["after"] == lean.catalog.names()
    (skipped,) = whole.skipped
    assert skipped.position == 1 and column in skipped.reason
    assert [(s.position, s.reason) for s in lean.skipped] == [(1, skipped.reason)]


def test_the_cli_reads_past_text_that_is_not_utf8(sqlite_url: str, tmp_path: Path) -> None:
    engine = make_engine(sqlite_url)
    insert_raw_event(engine, 1, payload={"model": definition("edited")}, model="edited")
    insert_raw_event(engine, 2, payload={"model": definition("after")}, model="after")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE events SET payload = CAST(? AS TEXT) WHERE position = 1",
            (bytes(not_utf8(b"{}")),),
        )
    engine.dispose()
    cli = Cli(tmp_path, sqlite_url)

    assert [m["name"] for m in cli.json("models")] == ["after"]
    listed = cli("history")
    assert listed.returncode == 0, listed.stderr
    assert "unreadable row: columns not of their type: payload" in listed.stdout
    verified = cli("verify")
    assert verified.returncode == 1 and "Traceback" not in verified.stderr
    assert "verify failed at position 1: the row cannot be read" in verified.stderr
