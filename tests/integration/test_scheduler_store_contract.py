"""The scheduler store's contract, run unchanged against SQLite and PostgreSQL.

Every method of ``SchedulerStore`` (what the CLI, the API and the daemon use)
is held to the same behaviour on each back end; the back-end differences live
in ``scheduler.persistence.backend`` only (its ``SQLITE`` and ``POSTGRESQL``).
There is no in-memory implementation: the store's behaviour is its SQL
(fencing, numbering under a lock, upserts), and the planner it serves is
already pure and tested without a database.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, event, insert

from catalog import Catalog
from events.catalog_service import CatalogService
from events.storage.backends import open_log
from scheduler.daemon.round_runner import Placer
from scheduler.lifecycle.inputs import Lifecycle
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.record_format import CURRENT_SCHEMA, FULL_ROUND, ROUND
from scheduler.persistence.store import PLACED, RoundConflict, SchedulerStore
from scheduler.persistence.tables import InventoryRow, PlacementRoundRow, table
from scheduler.planner.fleet.inventory import parse_node_report
from scheduler.planner.fleet.placements import Placement, Plan, Removal
from tests.support import model

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
_OTHER = Placement("other", 0, "default", ("n1",), 1, "A100")


def _report(name: str, gpus: int = 8, **extra: Any) -> Any:
    return parse_node_report(
        {"name": name, "gpu_class": "A100", "gpus": gpus, "memory_gb": 512, **extra}
    )


@pytest.fixture
def store(engine: Engine) -> SchedulerStore:
    return SchedulerStore(engine)


@pytest.fixture
def placer(engine: Engine, store: SchedulerStore) -> Placer:
    declared = Catalog.build([model("llama", tp=4, scaling={"min": 2})])
    return Placer(CatalogService(open_log(engine), declared), store)


def test_an_empty_store_has_no_nodes_no_placements_no_events_and_no_rounds(
    store: SchedulerStore,
) -> None:
    assert store.nodes() == []
    state = store.state()
    assert (state.round_id, state.placements, state.lifecycle) == (0, (), Lifecycle())
    assert store.replicas() == []
    assert store.service() == ({}, {})
    assert list(store.events()) == []
    assert store.recorded_round() is None


def test_reports_are_upserted_by_name_and_nodes_come_back_by_name(store: SchedulerStore) -> None:
    store.report([_report("b"), _report("a", labels={"zone": "eu"})], T0)
    store.report([_report("a", gpus=2, fabric="ib")], T0 + timedelta(seconds=5))
    nodes = store.nodes()
    assert [n.name for n in nodes] == ["a", "b"]
    assert (nodes[0].gpus, nodes[0].labels, nodes[0].fabric) == (2, {}, "ib")
    assert nodes[0].reported_at == T0 + timedelta(seconds=5)
    assert store.report([], T0) == []
    assert store.forget("b") and not store.forget("b")
    assert [n.name for n in store.nodes()] == ["a"]


def test_rounds_are_numbered_from_one_and_fenced(store: SchedulerStore, placer: Placer) -> None:
    store.report([_report("n1"), _report("n2")], T0)
    stale = store.state()
    assert placer.run(now=T0).round_id == 1
    assert store.state().round_id == 1
    with pytest.raises(RoundConflict):
        store.apply(
            Plan(keep=(), place=(_OTHER,), remove=(), unplaced=()),
            based_on=stale,
            catalog_position=0,
            nodes=store.nodes(),
            now=T0,
            policy=StalenessPolicy(),
        )
    assert store.state().round_id == 1


def test_placements_replicas_and_service_agree(store: SchedulerStore, placer: Placer) -> None:
    store.report([_report("n1"), _report("n2")], T0)
    placer.run(now=T0)
    placements = store.state().placements
    assert [(p.model, p.replica) for p in placements] == [("llama", 0), ("llama", 1)]
    replicas = store.replicas()
    assert [p for p, _ in replicas] == list(placements)
    assert all(s.state == "placed" and not s.reported for _, s in replicas)
    host = placements[0].nodes[0]
    assert [p for p, _ in store.replicas(node=host)] == [p for p in placements if host in p.nodes]
    assert store.replicas(model="other") == []
    _, hosted = store.service()
    assert sum(hosted.values()) == sum(len(p.nodes) for p in placements)


def test_a_nodes_placements_are_read_from_its_rows_alone_and_as_the_whole_state_says(
    engine: Engine, store: SchedulerStore, placer: Placer
) -> None:
    """An agent's read of its placements (``GET /v1/placements?node=``) reads that node's
    rows, not the whole state (every placement, replica failure, running copy and cordon:
    3.9 s of CPU at 110,000 placements, for each agent's read); it answers what the whole
    state says of the node, with names a LIKE pattern would confuse."""
    store.report([_report("n_1"), _report("nx1"), _report("n1", replicas=[])], T0)
    placer.run(now=T0)
    state = store.state()
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    for name in ("n_1", "nx1", "n1", "n", "n%1", "absent"):
        statements.clear()
        assert store.replicas(node=name) == state.replicas(node=name), name
        read = " ".join(statements)
        assert not any(t in read for t in ("replica_failures", "running_copies", "node_cordons"))
    assert sum(len(store.replicas(node=n)) for n in ("n_1", "nx1", "n1")) == 2


def test_a_report_with_its_service_state_is_the_report_then_the_service(
    store: SchedulerStore, placer: Placer
) -> None:
    """What the API answers a batch of reports with (one transaction) equals a report
    followed by a separate read of the service state."""
    store.report([_report("n1"), _report("n2")], T0)
    placer.run(now=T0)
    store.cordon("n2", "draining", actor="op", reason="move")
    later = T0 + timedelta(seconds=10)

    nodes, cordons, hosted = store.report_and_service(
        [_report("n1", gpus=4), _report("n2")], later, actor=["agent-1", "agent-2"]
    )

    assert [(n.name, n.gpus, n.reported_at) for n in nodes] == [
        ("n1", 4, later),
        ("n2", 8, later),
    ]
    assert store.nodes() == nodes
    assert (cordons, hosted) == store.service()
    assert cordons["n2"].mode == "draining" and sum(hosted.values()) == 2


def _service_of(store: SchedulerStore, names: list[str]) -> tuple[dict[str, Any], dict[str, int]]:
    """The service state of ``names`` as the API answered it before batches kept the counts:
    every cordon and every placement read afresh."""
    cordons, hosted = store.service()
    return (
        {n: cordons[n] for n in names if n in cordons},
        {n: hosted[n] for n in names if n in hosted},
    )


def _round(
    store: SchedulerStore, place: tuple[Placement, ...] = (), remove: tuple[Any, ...] = ()
) -> int | None:
    return store.apply(
        Plan(keep=(), place=place, remove=remove, unplaced=()),
        based_on=store.state(),
        catalog_position=0,
        nodes=store.nodes(),
        now=T0,
        policy=StalenessPolicy(),
    )


def test_a_batch_answers_the_placements_of_a_round_another_process_wrote(engine: Engine) -> None:
    """The server keeps the replica counts between batches: a round written since by
    another store (the daemon) must show in the next batch's answer, multi-node replicas
    and cordons of the batch's nodes included, and nothing of the nodes not reported."""
    server, daemon = SchedulerStore(engine), SchedulerStore(engine)
    names = ["n1", "n2", "n3"]
    server.report([_report(n) for n in names], T0)
    wide = Placement("wide", 0, "tp2", ("n1", "n2"), 4, "A100")
    _round(daemon, place=(wide, Placement("one", 0, "default", ("n2",), 1, "A100")))
    daemon.cordon("n2", "draining", actor="op", reason="move")
    daemon.cordon("n3", "cordoned", actor="op", reason="disk")

    _, cordons, hosted = server.report_and_service([_report("n1"), _report("n2")], T0)
    assert hosted == {"n1": 1, "n2": 2}
    assert (cordons, hosted) == _service_of(daemon, ["n1", "n2"])
    assert set(cordons) == {"n2"}  # n3's cordon is not this batch's

    _round(daemon, remove=(Removal(wide, "test"),))
    daemon.cordon("n2", None, actor="op", reason="back")
    _, cordons, hosted = server.report_and_service([_report("n1"), _report("n2")], T0)
    assert (cordons, hosted) == ({}, {"n2": 1})

    _round(daemon, place=(Placement("wide", 1, "tp2", ("n3", "n1"), 4, "A100"),))
    _, cordons, hosted = server.report_and_service([_report(n) for n in names], T0)
    assert (cordons, hosted) == _service_of(daemon, names)
    assert hosted == {"n1": 1, "n2": 1, "n3": 1} and set(cordons) == {"n3"}


_NODES = [f"n{i}" for i in range(6)]
_step = st.one_of(
    # A round placing a replica of "m" on one to three nodes...
    st.tuples(
        st.just("place"), st.lists(st.sampled_from(_NODES), min_size=1, max_size=3, unique=True)
    ),
    # ... removing the k-th placement (modulo how many there are) ...
    st.tuples(st.just("remove"), st.integers(0, 20)),
    st.tuples(
        st.just("service"), st.sampled_from(_NODES), st.sampled_from(["cordoned", "draining", None])
    ),
    # ... and a batch of reports, answered with its nodes' service state.
    st.tuples(
        st.just("report"), st.lists(st.sampled_from(_NODES), min_size=1, max_size=6, unique=True)
    ),
)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(_step, min_size=1, max_size=10))
def test_a_batch_answers_what_reading_every_placement_answers(
    engine: Engine, steps: list[tuple[Any, ...]]
) -> None:
    """Whatever rounds and cordons come between batches (written by another store, as the
    daemon and the CLI do), a batch's service state equals a fresh read of all placements
    and cordons. Examples share the database: each starts where the last one ended."""
    server, daemon = SchedulerStore(engine), SchedulerStore(engine)
    daemon.report([_report(n) for n in _NODES], T0)
    for step in steps:
        if step[0] == "place":
            taken = [p.replica for p in daemon.state().placements if p.model == "m"]
            replica = max(taken, default=-1) + 1
            _round(daemon, place=(Placement("m", replica, "d", tuple(step[1]), 1, "A100"),))
        elif step[0] == "remove":
            current = daemon.state().placements
            if current:
                _round(daemon, remove=(Removal(current[step[1] % len(current)], "test"),))
        elif step[0] == "service":
            daemon.cordon(step[1], step[2], actor="op", reason="test")
        else:
            names = list(step[1])
            _, cordons, hosted = server.report_and_service([_report(n) for n in names], T0)
            assert (cordons, hosted) == _service_of(daemon, names)


def test_cordons_are_recorded_once_with_an_event_and_lifted(
    store: SchedulerStore, placer: Placer
) -> None:
    store.report([_report("n1")], T0)
    assert store.cordon("n1", "cordoned", actor="op", reason="disk") is None
    before = store.cordon("n1", "cordoned", actor="op", reason="again")
    assert before is not None and before.reason == "disk"
    assert store.service()[0]["n1"].mode == "cordoned"
    assert store.cordon("n1", "draining", actor="op", reason="move") is not None
    assert store.cordon("n1", None, actor="op", reason="") is not None
    assert store.service()[0] == {}
    events = list(store.events())
    assert [e.type for e in events] == ["node.cordoned", "node.draining", "node.uncordoned"]
    assert [e.position for e in events] == [1, 2, 3]
    assert all(e.actor == "op" and e.nodes == ("n1",) for e in events)


def test_events_are_filtered_by_round_model_and_time(store: SchedulerStore, placer: Placer) -> None:
    store.report([_report("n1"), _report("n2")], T0)
    placer.run(now=T0)
    store.cordon("n1", "cordoned", actor="op", reason="")  # now: after T0, outside a round
    events = list(store.events())
    assert [e.position for e in events] == [1, 2, 3]
    assert [e.type for e in events] == [PLACED, PLACED, "node.cordoned"]
    # An event outside a round names the last round and its catalog position.
    assert [e.round_id for e in events] == [1, 1, 1]
    assert [e.position for e in store.events(round_id=1)] == [1, 2, 3]
    assert list(store.events(round_id=2)) == []
    assert [e.position for e in store.events(model="llama")] == [1, 2]
    assert [e.position for e in store.events(until=T0)] == [1, 2]
    assert [e.position for e in store.events(since=T0 + timedelta(seconds=1))] == [3]


def test_a_recorded_round_is_found_by_id_time_or_as_the_last(
    store: SchedulerStore, placer: Placer
) -> None:
    store.report([_report("n1"), _report("n2")], T0)
    first = placer.run(now=T0)
    recorded = store.recorded_round(round_id=first.round_id)
    assert recorded is not None and recorded.id == 1
    assert (recorded.placed, recorded.removed, recorded.unplaced) == (2, 0, 0)
    assert recorded.current == () and recorded.policy == placer.policy
    assert store.recorded_round() == recorded == store.recorded_round(at=T0)
    assert store.recorded_round(round_id=2) is None
    assert store.recorded_round(at=T0 - timedelta(seconds=1)) is None


def test_new_rounds_are_written_in_the_current_schema_version(
    engine: Engine, store: SchedulerStore, placer: Placer
) -> None:
    store.report([_report("n1"), _report("n2")], T0)
    placer.run(now=T0)
    with engine.connect() as conn:
        row = conn.execute(table(PlacementRoundRow).select()).mappings().one()
        nodes = conn.execute(table(InventoryRow).select()).mappings().one()["nodes"]
    # A full record in the version releases before 0024 read too (one recorded by
    # reference to an earlier round is at CURRENT_SCHEMA[ROUND]: scheduler.round_chain).
    assert json.loads(row["policy"])["schema_version"] == FULL_ROUND == CURRENT_SCHEMA[ROUND] - 1
    assert row["base_round"] is None
    assert {c["schema_version"] for c in json.loads(nodes)} == {2}


def test_a_round_written_before_versions_reads_as_it_did(
    engine: Engine, store: SchedulerStore
) -> None:
    """Rows in the shape releases wrote before versions: no schema_version, no preemption,
    no lifecycle (before 0005), placements without fingerprints, nodes without defaults."""
    old_nodes = [
        {"name": "n1", "gpu_class": "A100", "gpus": 8, "memory_gb": 512},
        {"name": "n2", "gpu_class": None, "gpus": 0, "memory_gb": None, "labels": {"a": "b"}},
    ]
    old_current = [
        {
            "model": "llama",
            "replica": 0,
            "profile": "default",
            "nodes": ["n1"],
            "gpus_per_node": 4,
            "gpu_class": "A100",
        }
    ]
    with engine.begin() as conn:
        conn.execute(insert(table(InventoryRow)), {"digest": "old", "nodes": json.dumps(old_nodes)})
        conn.execute(
            insert(table(PlacementRoundRow)),
            {
                "id": 1,
                "planned_at": T0,
                "catalog_position": 3,
                "inventory_digest": "old",
                "reported_at": json.dumps(
                    {"n1": T0.isoformat(), "n2": (T0 - timedelta(seconds=30)).isoformat()}
                ),
                "current": json.dumps(old_current),
                "policy": json.dumps(
                    {"stale_after_s": 90.0, "grace_s": 300.0, "mass_loss_fraction": 0.5}
                ),
                "placed": 1,
                "removed": 0,
                "unplaced": 0,
                "lifecycle": None,
            },
        )

    recorded = store.recorded_round()

    assert recorded is not None
    # Planned before defragmentation existed: replayed without it, as it ran.
    assert recorded.policy == StalenessPolicy(preemption=True, defragment=False)
    assert recorded.lifecycle == Lifecycle()
    assert recorded.current == (
        Placement("llama", 0, "default", ("n1",), 4, "A100", memory_gb_per_node=0, fingerprint=""),
    )
    n1, n2 = recorded.nodes
    assert (n1.labels, n1.fabric, n1.gpus_reserved, n1.reported_at) == ({}, None, 0, T0)
    assert (n2.labels, n2.gpu_class, n2.memory_gb) == ({"a": "b"}, None, None)


def test_a_batch_after_a_round_whose_trail_cannot_be_read_counts_every_placement(
    engine: Engine,
) -> None:
    """The counts kept between batches follow the rounds' trail (placed and removed
    events) rather than reading every placement again; a trail row of those rounds that
    cannot be read must not leave a count wrong: the placements are then read whole."""
    from sqlalchemy import update

    from scheduler.persistence.tables import PlacementEventRow

    server, daemon = SchedulerStore(engine), SchedulerStore(engine)
    names = ["n1", "n2"]
    server.report([_report(n) for n in names], T0)
    _round(daemon, place=(Placement("a", 0, "default", ("n1",), 1, "A100"),))
    assert server.report_and_service([_report(n) for n in names], T0)[2] == {"n1": 1}

    _round(daemon, place=(Placement("b", 0, "tp2", ("n1", "n2"), 4, "A100"),))
    second = table(PlacementEventRow)
    with engine.begin() as conn:
        conn.execute(update(second).where(second.c.round_id == 2).values(nodes='{"not": "a list"}'))
    _, cordons, hosted = server.report_and_service([_report(n) for n in names], T0)
    assert hosted == {"n1": 2, "n2": 1}
    assert (cordons, hosted) == _service_of(daemon, names)
