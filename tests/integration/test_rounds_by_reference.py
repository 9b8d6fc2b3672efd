"""Rounds recorded by reference to the round before, on both back ends (issue 42, item 3).

A placer's rounds after its first are written as what changed since the round before
(``placement_rounds.base_round``, ``changes``), not as a copy of every node, placement and
replica state; read back (``explain --round``), each equals the round recorded in full
from the same inputs. A link that cannot be read makes the rounds after it unreadable,
named with the link and its reason, never a crash; the last readable round is then the
one before it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from catalog import Catalog
from events.catalog_service import CatalogService
from events.storage.backends import open_log
from scheduler.daemon.round_runner import Placer
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence import (
    audit_trail,
    recorded_rounds,
    round_chain,
    round_store,
    row_decoding,
)
from scheduler.persistence.record_format import (
    RecordedRound,
    full_record,
    inventory_json,
    recorded_round,
)
from scheduler.persistence.store import RoundUnreadable, SchedulerStore
from scheduler.planner.fleet.inventory import NodeReport, parse_node_report
from tests.support import model

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
POLICY = StalenessPolicy(stale_after=timedelta(seconds=30), grace=timedelta(seconds=10))
NAMES = [f"n{i}" for i in range(8)]


def _node(name: str, replicas: list[dict[str, Any]] | None = None) -> NodeReport:
    raw: dict[str, Any] = {"name": name, "gpu_class": "A100", "gpus": 8, "address": name}
    if replicas is not None:
        raw["replicas"] = replicas
    return parse_node_report(raw)


class Recorded:
    """Each round's inputs as ``record_round`` was given them: the full record it would
    have written, decoded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full: dict[int, RecordedRound] = {}
        # A few nodes and replicas change by more than a quarter in most rounds, which
        # records them in full (``round_chain.LARGE_FRACTION``): here, by reference anyway.
        monkeypatch.setattr(round_chain, "LARGE_FRACTION", 0)
        record = recorded_rounds.record_round

        def spy(conn: Any, **kw: Any) -> Any:
            # A fresh node as the placer planned on it (``FRESH``) at the round's boundary.
            boundary = kw["now"] - kw["policy"].stale_after
            columns = full_record(
                kw["nodes"], kw["current"], kw["policy"], kw["lifecycle"], boundary
            )
            placed, removed, unplaced = kw["counts"]
            self.full[kw["round_id"]] = recorded_round(
                {
                    "id": kw["round_id"],
                    "planned_at": kw["now"],
                    "catalog_position": kw["catalog_position"],
                    "placed": placed,
                    "removed": removed,
                    "unplaced": unplaced,
                },
                {k: json.loads(v) for k, v in columns.items()},
                json.loads(inventory_json(kw["nodes"])),
            )
            return record(conn, **kw)

        monkeypatch.setattr(round_store, "record_round", spy)


def _rows(engine: Engine) -> dict[int, tuple[int | None, str, str]]:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT id, base_round, current, changes FROM placement_rounds ORDER BY id")
        ).all()
    return {int(r[0]): (r[1], str(r[2]), str(r[3])) for r in found}


def _scenario(
    engine: Engine, *, start: datetime = T0, fail_once: Callable[[], None] | None = None
) -> list[datetime]:
    """A placer's rounds: a model placed, its replicas reported starting then ready, a node
    cordoned, a host lost and its replicas placed again, one more node joining. The
    rounds that failed (``RuntimeError``, as the daemon's loop goes on after one)."""
    store = SchedulerStore(engine)
    declared = Catalog.build([model("llama", gpu_class="A100", tp=4, scaling={"min": 6})])
    placer = Placer(CatalogService(open_log(engine), declared), store, POLICY)
    store.report([_node(n) for n in NAMES], start)
    placer.run(now=start)
    at = start
    silent: set[str] = set()
    failed: list[datetime] = []

    def tick(reports: list[NodeReport] | None = None) -> None:
        nonlocal at
        at += timedelta(seconds=10)
        if reports:
            store.report(reports, at)
        store.renew_leases({n: at for n in NAMES if n not in silent})
        try:
            placer.run(now=at)
        except RuntimeError:
            failed.append(at)

    placed = store.state().placements
    hosts = sorted({n for p in placed for n in p.nodes})
    for state in ("starting", "ready"):
        tick(
            [
                _node(h, [{"model": p.model, "replica": p.replica, "state": state}
                          for p in placed if h in p.nodes])
                for h in hosts
            ]
        )  # fmt: skip
    store.rounds.cordon(hosts[-1], "draining", actor="alice", reason="maintenance")
    tick()
    if fail_once is not None:
        fail_once()
    silent.add(hosts[0])
    for _ in range(5):
        tick()
    tick([_node("n8")])
    return failed


def test_rounds_after_the_first_are_recorded_by_reference_and_read_as_in_full(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = Recorded(monkeypatch)
    _scenario(engine)
    store = SchedulerStore(engine)
    rows = _rows(engine)
    assert len(rows) >= 4, rows.keys()
    first = min(rows)
    assert rows[first][0] is None
    for round_id, (base, current, changes) in rows.items():
        if round_id != first:
            # Only what changed: not a copy of every placement.
            assert base == round_id - 1, f"round {round_id} recorded in full"
            assert current == "[]"
        if round_id > first + 1:  # the round after the first: its pins changed every one
            assert len(json.loads(changes)["current"]) < len(recorded.full[round_id].current)
        assert store.recorded_round(round_id=round_id) == recorded.full[round_id]
    assert store.recorded_round() == recorded.full[max(rows)]


def test_a_write_refused_after_its_round_was_recorded_leaves_the_chain_as_it_was(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = Recorded(monkeypatch)
    append = audit_trail.append_trail
    failing = {"left": 0}

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if failing["left"]:
            failing["left"] -= 1
            raise RuntimeError("the database went away")
        return append(*args, **kwargs)

    monkeypatch.setattr(round_store, "append_trail", flaky)

    def fail_once() -> None:
        failing["left"] = 1

    assert len(_scenario(engine, fail_once=fail_once)) == 1
    # The round that failed wrote nothing; the placer's next round took its id and was
    # recorded against the last round committed, and reads as its full record.
    store = SchedulerStore(engine)
    rows = _rows(engine)
    assert sum(base is not None for base, _, _ in rows.values()) >= 3
    for round_id in rows:
        assert store.recorded_round(round_id=round_id) == recorded.full[round_id]


def test_a_link_that_cannot_be_read_is_named_and_the_round_before_it_is_the_last(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = Recorded(monkeypatch)
    _scenario(engine)
    store = SchedulerStore(engine)
    rows = _rows(engine)
    last = max(rows)
    broken = last - 2
    assert rows[broken][0] is not None and rows[last][0] is not None
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE placement_rounds SET changes = :c WHERE id = :i"),
            {"c": '{"boundary": 3}', "i": broken},
        )
    with pytest.raises(RoundUnreadable, match="changes boundary 3 is not a time"):
        store.recorded_round(round_id=broken)
    with pytest.raises(
        RoundUnreadable,
        match=f"recorded by reference to round {broken}, which cannot be read: "
        "changes boundary 3 is not a time",
    ):
        store.recorded_round(round_id=last)
    # The last readable round is the one before the broken link.
    assert store.recorded_round() == recorded.full[broken - 1]

    # A chain whose full record is gone: every round of it names the missing round.
    first = min(rows)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM placement_rounds WHERE id = :i"), {"i": first})
    with pytest.raises(
        RoundUnreadable, match=f"recorded by reference to round {first}, which is not stored"
    ):
        store.recorded_round(round_id=first + 1)
    assert store.recorded_round() is None


def test_a_new_writer_starts_its_chain_with_a_full_record(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = Recorded(monkeypatch)
    _scenario(engine)
    before = max(_rows(engine))
    # Another process (a restarted daemon, a new leader) writes the next rounds.
    _scenario(engine, start=T0 + timedelta(hours=1))
    rows = _rows(engine)
    assert rows[before + 1][0] is None
    assert all(rows[i][0] == i - 1 for i in rows if i > before + 1)
    store = SchedulerStore(engine)
    for round_id in rows:
        assert store.recorded_round(round_id=round_id) == recorded.full[round_id]


def test_a_round_whose_replica_states_pass_a_megabyte_reads(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every replica's state of a round is some 250 bytes: a round of more than about
    4,000 replicas held more than a megabyte of them, read within a node list's bounds
    (1 MB) and unreadable; the chains after it with it."""
    recorded = Recorded(monkeypatch)
    _scenario(engine)
    rows = _rows(engine)
    first = min(rows)
    full = recorded.full[first]
    key = ("llama", 99)
    big = ReplicaStatus("starting", T0, T0, message="x" * (1 << 20))
    lifecycle = dataclasses.replace(full.lifecycle, statuses={**full.lifecycle.statuses, key: big})
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE placement_rounds SET lifecycle = :l WHERE id = :i"),
            {"l": json.dumps(lifecycle.to_json()), "i": first},
        )
    store = SchedulerStore(engine)
    read = store.recorded_round(round_id=first)
    assert read is not None and read.lifecycle.statuses[key].message == big.message
    assert store.recorded_round(round_id=first + 1) is not None


def test_a_chain_whose_changes_together_pass_a_rounds_bounds_is_unreadable(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: hostile rows by reference, each link's changes within a round's bounds
    (ROUND_LIMITS, 256 MB) and up to MAX_CHAIN (1,000) links: a read held every link's
    text and rebuilt them all, some 256 GB. The chain's changes together are held to
    one round's bounds (the writer keeps them to a quarter of a full record). Scaled
    down here: the bounds at 64 kB, each link padded to 30 kB."""
    recorded = Recorded(monkeypatch)
    _scenario(engine)
    rows = _rows(engine)
    last = max(rows)
    store = SchedulerStore(engine)
    bounds = dataclasses.replace(row_decoding.ROUND_LIMITS, max_bytes=64 << 10)
    monkeypatch.setattr(recorded_rounds, "ROUND_LIMITS", bounds)
    assert store.recorded_round(round_id=last) == recorded.full[last]
    with engine.begin() as conn:
        for round_id, (base, _, changes) in rows.items():
            if base is not None:
                conn.execute(
                    text("UPDATE placement_rounds SET changes = :c WHERE id = :i"),
                    {"c": changes + " " * (30_000 - len(changes)), "i": round_id},
                )
    first_link = min(i for i, row in rows.items() if row[0] is not None)
    assert store.recorded_round(round_id=first_link) == recorded.full[first_link]
    with pytest.raises(RoundUnreadable, match="hold more than 65536 bytes"):
        store.recorded_round(round_id=last)


def test_the_search_for_the_last_readable_round_rebuilds_a_broken_chain_once(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain's full record that cannot be read as one (here its changes): the search
    for the last readable round rebuilt every later round of the chain up to it again,
    decoding the full record each time (some 64 times 60 MB at issue 42's scale): once
    is enough, the rounds after it in that chain then known unreadable, for that reason."""
    recorded = Recorded(monkeypatch)
    _scenario(engine)
    rows = _rows(engine)
    first, last = min(rows), max(rows)
    assert last - first >= 3 and all(rows[i][0] == i - 1 for i in rows if i != first)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE placement_rounds SET changes = :c WHERE id = :i"),
            {"c": '{"boundary": 3}', "i": first},
        )
    decoded: list[int] = []
    full_documents = recorded_rounds._full_documents

    def counted(conn: Any, r: Any) -> Any:
        decoded.append(r["id"])
        return full_documents(conn, r)

    monkeypatch.setattr(recorded_rounds, "_full_documents", counted)
    store = SchedulerStore(engine)
    # The full record itself reads (its changes are a chain's only); every later round
    # names it.
    assert store.recorded_round() == recorded.full[first]
    assert decoded == [first, first], decoded
    for round_id in range(first + 1, last + 1):
        with pytest.raises(
            RoundUnreadable,
            match=f"recorded by reference to round {first}, which cannot be read: "
            "changes boundary 3 is not a time",
        ):
            store.recorded_round(round_id=round_id)


def test_a_links_columns_other_than_its_changes_are_not_read_along_a_chain(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: hostile rows by reference carrying what no such row holds (a current, a
    lifecycle of megabytes; gigabytes for a database's text): reading a round fetched
    every link of its chain whole and held them all, up to MAX_CHAIN of them, past any
    bound on what is decoded. A link's changes are all the walk reads of it."""
    import tracemalloc

    recorded = Recorded(monkeypatch)
    _scenario(engine)
    rows = _rows(engine)
    last = max(rows)
    padding = 4 << 20
    with engine.begin() as conn:
        for round_id, (base, _, _) in rows.items():
            if base is not None and round_id != last:
                conn.execute(
                    text("UPDATE placement_rounds SET current = :c, lifecycle = :c WHERE id = :i"),
                    {"c": "[" + " " * padding + "]", "i": round_id},
                )
    store = SchedulerStore(engine)
    tracemalloc.start()
    try:
        assert store.recorded_round(round_id=last) == recorded.full[last]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < padding, f"{peak} bytes at the peak of a read of a few kilobytes"
