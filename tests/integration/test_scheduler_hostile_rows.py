"""A scheduler row that cannot be read is skipped and named, on both stores, by every reader:
`nodes list`, `placements`, a daemon round, `explain --round` and the API go on without it."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, MutableMapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, delete, insert
from structlog.testing import capture_logs

from catalog import Catalog
from events.catalog_service import CatalogService
from events.database.connection import make_engine
from events.storage.backends import open_log
from scheduler.daemon.round_runner import Placer
from scheduler.persistence.outcome_store import Outcome
from scheduler.persistence.row_decoding import Unreadable
from scheduler.persistence.store import RoundUnreadable, SchedulerStore
from scheduler.persistence.tables import (
    CordonRow,
    FailureRow,
    InventoryRow,
    NodeRow,
    PlacementEventRow,
    PlacementOutcomeRow,
    PlacementRoundRow,
    PlacementRow,
    table,
)
from scheduler.planner.fleet.inventory import parse_node_report
from tests.api.server import ApiServer, Tokens, running
from tests.e2e.cli import Cli
from tests.hostile.documents import deep_json_array
from tests.support import definition, model, not_utf8, raw_value_mark

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TABLES = {
    row.__tablename__: table(row)
    for row in (
        NodeRow,
        PlacementRow,
        PlacementEventRow,
        PlacementRoundRow,
        InventoryRow,
        CordonRow,
        FailureRow,
        PlacementOutcomeRow,
    )
}
# Text no JSON reader accepts whole: invalid, 2,000 deep, larger than any stored document.
BAD_JSON = {
    "invalid": "{not json",
    "deep": deep_json_array(2000),
    "huge": json.dumps(["x" * 1000] * 2000),  # 2 MB: no list of names or labels is 1 MB
    "wrong shape": '{"a": 1}',
}


def insert_raw(engine: Engine, name: str, values: dict[str, Any]) -> None:
    """A row as given: on SQLite past every type processor (any value in any column)."""
    with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            columns = ", ".join(values)
            marks = ", ".join(raw_value_mark(k, v) for k, v in values.items())
            conn.exec_driver_sql(
                f"INSERT INTO {name} ({columns}) VALUES ({marks})",
                {k: _stored(v) for k, v in values.items()},
            )
        else:
            conn.execute(insert(TABLES[name]), values)


def _stored(value: Any) -> Any:
    # How SQLite keeps a UTC time (events.database.tables.UTCDateTime): naive, in UTC.
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ")
    return value


def _node_row(name: str, **changed: Any) -> dict[str, Any]:
    return {
        "name": name,
        "gpu_class": "A100",
        "gpus": 8,
        "gpus_reserved": 0,
        "memory_gb": 512.0,
        "labels": "{}",
        "fabric": None,
        "reported_at": T0,
        "reports_replicas": False,
        **changed,
    }


def _placement_row(model_name: str, replica: int, **changed: Any) -> dict[str, Any]:
    return {
        "model": model_name,
        "replica": replica,
        "profile": "default",
        "nodes": '["n1"]',
        "gpus_per_node": 4,
        "gpu_class": "A100",
        "memory_gb_per_node": 0,
        "round_id": 1,
        "placed_at": T0,
        "state": "placed",
        "message": "",
        "fingerprint": "",
        **changed,
    }


def _event_row(position: int, **changed: Any) -> dict[str, Any]:
    return {
        "position": position,
        "round_id": 1,
        "type": "placement.placed",
        "model": "llama",
        "replica": 0,
        "profile": "default",
        "nodes": '["n1"]',
        "reason": "",
        "catalog_position": 1,
        "recorded_at": T0,
        "actor": "",
        **changed,
    }


def _reports(*names: str) -> list[Any]:
    return [
        parse_node_report({"name": n, "gpu_class": "A100", "gpus": 8, "memory_gb": 512})
        for n in names
    ]


@pytest.fixture
def placer(engine: Engine) -> Placer:
    declared = Catalog.build([model("llama", tp=4, scaling={"min": 2})])
    return Placer(CatalogService(open_log(engine), declared), SchedulerStore(engine))


@pytest.fixture
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    with capture_logs() as captured:
        yield captured


def _skipped(
    logs: list[MutableMapping[str, Any]], table_name: str
) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == "scheduler.row_skipped" and e["table"] == table_name]


@pytest.mark.parametrize("bad", sorted(BAD_JSON))
def test_a_node_whose_labels_cannot_be_read_is_skipped_and_named(
    engine: Engine, placer: Placer, logs: list[MutableMapping[str, Any]], bad: str
) -> None:
    store = placer.store
    store.report(_reports("n1", "n2"), T0)
    insert_raw(engine, "nodes", _node_row("bad", labels=BAD_JSON[bad]))

    assert [n.name for n in store.nodes()] == ["n1", "n2"]
    (named,) = _skipped(logs, "nodes")
    assert named["key"] == "('bad',)" and named["reason"]
    assert placer.run(now=T0).round_id == 1  # the round goes on with the nodes it can read
    assert {n for p in store.state().placements for n in p.nodes} <= {"n1", "n2"}


@pytest.mark.parametrize("bad", sorted(BAD_JSON))
def test_a_placement_whose_nodes_cannot_be_read_is_skipped_named_and_its_slot_reused(
    engine: Engine, placer: Placer, logs: list[MutableMapping[str, Any]], bad: str
) -> None:
    store = placer.store
    store.report(_reports("n1", "n2"), T0)
    insert_raw(engine, "placements", _placement_row("llama", 0, nodes=BAD_JSON[bad]))

    assert store.state().placements == ()
    assert store.replicas() == []
    assert store.service()[1] == {}
    assert _skipped(logs, "placements")[0]["key"] == "('llama', 0)"
    # The planner saw slot 0 free and placed into it: the unreadable row gives way, recorded.
    outcome = placer.run(now=T0)
    assert outcome.round_id == 1
    assert sorted(p.replica for p in store.state().placements) == [0, 1]
    removed = [e for e in store.events() if e.type == "placement.removed"]
    assert [(e.model, e.replica, e.reason) for e in removed] == [
        ("llama", 0, "its stored placement could not be read")
    ]


def test_a_placement_event_that_cannot_be_read_is_skipped_and_named(
    engine: Engine, placer: Placer, logs: list[MutableMapping[str, Any]]
) -> None:
    store = placer.store
    store.report(_reports("n1", "n2"), T0)
    placer.run(now=T0)
    insert_raw(engine, "placement_events", _event_row(3, nodes=BAD_JSON["deep"]))
    insert_raw(engine, "placement_events", _event_row(4, nodes='["n1", 7]'))
    placer.run(now=T0 + timedelta(minutes=10))  # numbering goes on after the bad rows

    assert [e.position for e in store.events()][:2] == [1, 2]
    assert 3 not in [e.position for e in store.events()]
    assert {e["key"] for e in _skipped(logs, "placement_events")} == {"(3,)", "(4,)"}


def test_a_recorded_round_that_cannot_be_read_is_skipped_and_the_one_before_is_found(
    engine: Engine, placer: Placer, logs: list[MutableMapping[str, Any]]
) -> None:
    store = placer.store
    store.report(_reports("n1", "n2"), T0)
    first = placer.run(now=T0)
    good = store.recorded_round(round_id=first.round_id)
    assert good is not None
    with engine.begin() as conn:
        digest = conn.execute(TABLES["placement_rounds"].select()).mappings().one()
    for round_id, column, value in [
        (2, "policy", BAD_JSON["deep"]),
        (3, "current", '[{"model": 1}]'),
        (4, "reported_at", "{}"),
        (5, "policy", json.dumps({"schema_version": 99})),
        (6, "lifecycle", '{"statuses": 5}'),
    ]:
        row = {**digest, "id": round_id, "planned_at": T0 + timedelta(seconds=round_id)}
        insert_raw(engine, "placement_rounds", {**row, column: value})

    assert store.recorded_round() == good
    assert store.recorded_round(at=T0 + timedelta(seconds=4)) == good
    # Asked for by id, an unreadable round says so, with the reason (not "not recorded").
    with pytest.raises(RoundUnreadable, match="newer than this code reads"):
        store.recorded_round(round_id=5)
    assert store.recorded_round(round_id=99) is None
    reasons = {e["key"]: e["reason"] for e in _skipped(logs, "placement_rounds")}
    assert "newer than this code reads" in reasons["(5,)"]
    assert "no report time for node" in reasons["(4,)"]
    assert set(reasons) == {"(2,)", "(3,)", "(4,)", "(5,)", "(6,)"}
    # A round over them all is still written, numbered after the last.
    store.report(_reports("n3"), T0 + timedelta(minutes=10))
    assert store.state().round_id == 6


def test_sqlite_rows_with_values_of_the_wrong_type_are_skipped_and_named(
    sqlite_url: str, logs: list[MutableMapping[str, Any]]
) -> None:
    from events.database.connection import make_engine

    engine = make_engine(sqlite_url)
    store = SchedulerStore(engine)
    store.report(_reports("n1"), T0)
    insert_raw(engine, "nodes", _node_row("t", reported_at="yesterday"))
    insert_raw(engine, "nodes", _node_row("g", gpus="eight"))
    insert_raw(engine, "nodes", _node_row("b", labels=b"\xff\x00"))
    insert_raw(engine, "nodes", _node_row("nul", labels='{"a": "x\x00"}'))
    insert_raw(
        engine,
        "node_cordons",
        {"node": "n1", "mode": b"\x01", "actor": "", "reason": "", "since": T0},
    )
    insert_raw(engine, "placements", _placement_row("m", 0, placed_at=b"\x00"))
    insert_raw(engine, "placements", _placement_row("m", 1, state_since="never"))
    insert_raw(engine, "placements", _placement_row("m", 2, gpus_per_node=1.5))

    assert [n.name for n in store.nodes()] == ["n1"]
    state = store.state()
    assert state.placements == () and state.lifecycle.cordons == {}
    assert {e["key"] for e in _skipped(logs, "nodes")} == {"('t',)", "('g',)", "('b',)", "('nul',)"}
    assert len(_skipped(logs, "placements")) == 3
    assert len(_skipped(logs, "node_cordons")) == 1
    # A cordon over the unreadable one replaces it.
    assert store.cordon("n1", "cordoned", actor="op", reason="") is None
    assert store.state().lifecycle.cordons["n1"].mode == "cordoned"
    engine.dispose()


def test_the_cli_and_the_api_serve_past_unreadable_scheduler_rows(
    tmp_path: Path, db_url: str, engine: Engine
) -> None:
    store = SchedulerStore(engine)
    store.report(_reports("n1"), datetime.now(UTC))
    insert_raw(engine, "nodes", _node_row("bad", labels=BAD_JSON["deep"]))
    insert_raw(engine, "placements", _placement_row("llama", 0, nodes=BAD_JSON["invalid"]))
    insert_raw(engine, "placements", _placement_row("llama", 1, nodes='["n1"]'))
    cli = Cli(tmp_path, db_url)

    assert [n["name"] for n in cli.json("nodes", "list")] == ["n1"]
    assert [p["replica"] for p in cli.json("placements")] == [1]
    assert cli("placements").returncode == 0
    history = cli("history", "--placements")
    assert history.returncode == 0, history.stderr

    tokens = Tokens.issue()
    server = ApiServer(tmp_path, db_url, tokens=tokens, declared=None)
    with running(server), server.client(tokens.reader) as c:
        assert [n["name"] for n in c.get("/v1/nodes").json()] == ["n1"]
        assert [p["replica"] for p in c.get("/v1/placements").json()] == [1]
    assert {e["table"] for e in server.logs("scheduler.row_skipped")} == {"nodes", "placements"}


# What a column accepts: anything at all in SQLite, text without NUL in PostgreSQL. Made
# once, not again for every draw (as in tests/unit/scheduler/test_round_chain.py).
@functools.cache
def _text() -> st.SearchStrategy[str]:
    structured = st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
        max_leaves=8,
    ).map(json.dumps)
    deep = st.integers(0, 3000).map(deep_json_array)
    return (st.text(max_size=30) | structured | deep).map(lambda s: s.replace("\0", ""))


@functools.cache
def _any() -> st.SearchStrategy[Any]:
    scalars = st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
    # Bytes as a BLOB, and as TEXT that is not UTF-8 (tests.support.NotUtf8).
    undecodable = st.binary(max_size=19).map(not_utf8)
    return scalars | st.binary(max_size=20) | undecodable | _text()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_value_in_a_json_column_or_any_sqlite_column_stops_a_reader_or_a_round(
    engine: Engine, placer: Placer, data: st.DataObject
) -> None:
    sqlite = engine.dialect.name == "sqlite"
    with engine.begin() as conn:
        for name in ("placement_events", "placement_rounds", "inventories", "placements", "nodes"):
            conn.execute(delete(TABLES[name]))
    node = _node_row("hostile", labels=data.draw(_text()))
    placement = _placement_row("llama", 5, nodes=data.draw(_text()))
    event = _event_row(1, nodes=data.draw(_text()))
    if sqlite:
        for row in (node, placement, event):
            for column in data.draw(st.lists(st.sampled_from(sorted(row)), max_size=3)):
                if column not in ("name", "model", "replica", "position"):
                    row[column] = data.draw(_any())
    insert_raw(engine, "nodes", node)
    insert_raw(engine, "placements", placement)
    insert_raw(engine, "placement_events", event)
    store = placer.store
    store.report(_reports("n1", "n2"), T0)

    assert "n1" in [n.name for n in store.nodes()]
    store.service()
    store.replicas()
    list(store.events())
    outcome = placer.run(now=T0)
    assert outcome.round_id is not None
    assert store.recorded_round() is not None
    assert len([p for p in store.state().placements if p.model == "llama"]) >= 2


@pytest.mark.parametrize("state", ["paused", "", "READY", "unreported", "ready\n"])
def test_a_placement_whose_state_is_not_a_known_state_is_skipped_named_and_its_slot_reused(
    engine: Engine, placer: Placer, logs: list[MutableMapping[str, Any]], state: str
) -> None:
    """A state this code does not know (hand-written, from a newer release, corrupted)
    is unreadable like any other bad value: a round must not decide on it (rollouts treat
    placed, starting, ready and failed each their own way) and an agent or the dashboard
    must not be handed a state the API's document says it never sends. Shown as
    "unreadable" instead, the replica would still count as placed with no state to
    decide by; skipped, its slot is planned again, as for any unreadable placement."""
    store = placer.store
    store.report(_reports("n1", "n2"), T0)
    insert_raw(engine, "placements", _placement_row("llama", 0, state=state))

    assert store.state().placements == ()
    assert store.replicas() == []
    named = _skipped(logs, "placements")  # once per read
    assert {e["key"] for e in named} == {"('llama', 0)"}
    assert "is not a replica state (placed, starting, ready, failed)" in named[0]["reason"]
    outcome = placer.run(now=T0)
    assert outcome.round_id == 1
    assert {s.state for s in store.state().lifecycle.statuses.values()} == {"placed"}
    removed = [e for e in store.events() if e.type == "placement.removed"]
    assert [(e.model, e.replica) for e in removed] == [("llama", 0)]


def test_a_recorded_round_whose_lifecycle_holds_an_unknown_state_or_mode_is_unreadable(
    engine: Engine, placer: Placer, logs: list[MutableMapping[str, Any]]
) -> None:
    store = placer.store
    store.report(_reports("n1", "n2"), T0)
    first = placer.run(now=T0)
    good = store.recorded_round(round_id=first.round_id)
    assert good is not None and good.lifecycle.statuses == {}
    with engine.begin() as conn:
        row = dict(conn.execute(TABLES["placement_rounds"].select()).mappings().one())
    status = {
        "model": "llama",
        "replica": 0,
        "state": "hibernating",
        "since": T0.isoformat(),
        "placed_at": T0.isoformat(),
        "message": "",
        "endpoint": None,
        "reported": True,
    }
    cordon = {"node": "n1", "mode": "frozen", "actor": "", "reason": "", "since": T0.isoformat()}
    backoff = {"base_s": 30, "cap_s": 600}
    for round_id, lifecycle in [
        (2, {"statuses": [status], "cordons": [], "failures": [], "backoff": backoff}),
        (3, {"statuses": [], "cordons": [cordon], "failures": [], "backoff": backoff}),
    ]:
        insert_raw(
            engine,
            "placement_rounds",
            {
                **row,
                "id": round_id,
                "planned_at": T0 + timedelta(seconds=round_id),
                "lifecycle": json.dumps(lifecycle),
            },
        )

    assert store.recorded_round() == good
    with pytest.raises(RoundUnreadable, match="'hibernating' is not a replica state"):
        store.recorded_round(round_id=2)
    with pytest.raises(RoundUnreadable, match="mode 'frozen' is neither"):
        store.recorded_round(round_id=3)


def test_explain_round_on_an_unreadable_round_says_it_exists_and_why_not_not_recorded(
    tmp_path: Path, db_url: str, engine: Engine
) -> None:
    cli = Cli(tmp_path, db_url)
    cli.write("catalog.yaml", {"models": [definition("llama", tp=4, scaling={"min": 1})]})
    node = {"name": "n1", "gpu_class": "A100", "gpus": 8}
    assert cli("nodes", "report", cli.write("n.yaml", node)).returncode == 0
    assert cli.json("place")["round"] == 1
    with engine.begin() as conn:
        row = dict(conn.execute(TABLES["placement_rounds"].select()).mappings().one())
    insert_raw(
        engine,
        "placement_rounds",
        {**row, "id": 2, "policy": json.dumps({"schema_version": 99})},
    )

    done = cli("explain", "llama", "--round", "2")
    assert done.returncode == 1
    assert "not recorded" not in done.stderr
    assert (
        "cannot explain 'llama' in round 2: the round is recorded but its row cannot be read"
        in (done.stderr)
    )
    assert "newer than this code reads" in done.stderr  # the reason row_skipped logs
    # A round that was never recorded still says so, and a readable one still explains.
    assert "round 3 is not recorded" in cli("explain", "llama", "--round", "3").stderr
    assert cli.json("explain", "llama", "--round", "1")["replicas"][0]["outcome"] == "placed"


@pytest.mark.parametrize("column", ["name", "gpu_class", "labels", "fabric", "reported_at"])
def test_a_node_row_holding_text_that_is_not_utf8_is_skipped_and_named(
    sqlite_url: str, logs: list[MutableMapping[str, Any]], column: str
) -> None:
    """Only SQLite can hold such text; its driver used to fail the whole read of the
    table on it, so `nodes list`, `place` and the API stopped on one edited row."""
    engine = make_engine(sqlite_url)
    try:
        declared = Catalog.build([model("llama", tp=4, scaling={"min": 2})])
        placer = Placer(CatalogService(open_log(engine), declared), SchedulerStore(engine))
        placer.store.report(_reports("n1", "n2"), T0)
        row = _node_row("bad")
        row[column] = not_utf8(b"x")
        insert_raw(engine, "nodes", row)

        assert [n.name for n in placer.store.nodes()] == ["n1", "n2"]
        (named,) = _skipped(logs, "nodes")
        if column == "name":
            assert named["key"] == "(b'\\x80x',)"
        else:
            assert named["key"] == "('bad',)" and column in named["reason"]
        assert placer.run(now=T0).round_id == 1
    finally:
        engine.dispose()


UNPLACED_BAD = {
    **BAD_JSON,
    "not a list": '{"model": "llama"}',
    "missing reason": '[{"model": "llama", "replica": 0}]',
    "replica as text": '[{"model": "llama", "replica": "0", "reason": "r"}]',
}


@pytest.mark.parametrize("bad", sorted(UNPLACED_BAD))
def test_a_last_round_outcome_that_cannot_be_read_is_named_and_the_next_round_replaces_it(
    engine: Engine, placer: Placer, logs: list[MutableMapping[str, Any]], bad: str
) -> None:
    store = placer.store
    small = parse_node_report({"name": "n1", "gpu_class": "A100", "gpus": 4, "memory_gb": 512})
    store.report([small], T0)  # room for one of llama's two replicas
    placer.run(now=T0)
    first = store.outcome()
    assert isinstance(first, Outcome) and [u.replica for u in first.unplaced] == [1]
    with engine.begin() as conn:
        conn.execute(delete(TABLES["placement_outcome"]))
    row = {
        "id": 1,
        "planned_at": T0,
        "catalog_position": 0,
        "round_id": 1,
        "unplaced": UNPLACED_BAD[bad],
    }
    insert_raw(engine, "placement_outcome", row)

    unreadable = store.outcome()
    assert isinstance(unreadable, Unreadable), bad
    assert [e["key"] for e in _skipped(logs, "placement_outcome")] == ["(1,)"]

    store.report(_reports("n1", "n2"), T0 + timedelta(seconds=5))
    fresh = Placer(placer.catalog, store)  # a daemon starting: its first round writes
    fresh.run(now=T0 + timedelta(seconds=5))
    replaced = store.outcome()
    assert isinstance(replaced, Outcome) and replaced.unplaced == ()
