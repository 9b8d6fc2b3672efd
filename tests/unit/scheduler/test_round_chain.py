"""Rounds recorded by reference: a round rebuilt from its chain is the round recorded in full.

``scheduler.persistence.round_chain`` records a round as what changed since the round
before; reading rebuilds the full record's documents along the chain. Over random
sequences of rounds (nodes joining, leaving, changing content, their report times moving,
on and off the freshness boundary, in other offsets; placements and replica states added,
changed, removed, sometimes out of key order; cordons), each round rebuilt from the rows a
writer made equals the round decoded from its full record, documents and all.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from scheduler.lifecycle.inputs import CORDONED, Cordon, Lifecycle
from scheduler.lifecycle.replica_reports import FAILED, PLACED, READY, STARTING, ReplicaStatus
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence import round_chain
from scheduler.persistence.record_format import (
    BY_REFERENCE,
    RecordedRound,
    UnreadableRow,
    full_record,
    inventory_json,
    policy_json,
    recorded_round,
    upcast_round,
)
from scheduler.persistence.round_chain import (
    ChainHead,
    Rebuilt,
    changes_since,
    full_changes,
    full_head,
)
from scheduler.planner.fleet.inventory import FRESH, Node, reported_at
from scheduler.planner.fleet.placements import Placement

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
POLICY = StalenessPolicy(stale_after=timedelta(seconds=15), grace=timedelta(seconds=5))
PLUS_ONE = timezone(timedelta(hours=1))
NAMES = [f"n{i}" for i in range(6)]
KEYS = [(m, r) for m in ("a", "b", "c") for r in range(3)]


@dataclass(frozen=True)
class Inputs:
    now: datetime
    nodes: tuple[Node, ...]
    current: tuple[Placement, ...]
    lifecycle: Lifecycle


# The strategies `rounds` draws from, made once: built inside the composite, each draw
# made new strategy objects that Hypothesis validated and labelled again (most of the
# test's CPU); the same strategies, so the same examples.
_ROUNDS = st.integers(1, 8)
_NAME = st.sampled_from(NAMES)
_SOME_NAMES = st.lists(_NAME, max_size=4, unique=True)
_ACTIONS = st.sampled_from(["put", "time", "boundary", "offset", "drop"])
_AGE = st.integers(0, 60)
_CLASSES = st.sampled_from(["A100", "H100", None])
_GPUS = st.integers(0, 8)
_MEMORY = st.none() | st.sampled_from([64.0, 512.0])
_LABELS = st.dictionaries(st.sampled_from(["zone", "rack"]), st.just("x"))
_FABRIC = st.none() | st.sampled_from(["f1", "f2"])
_RESERVED = st.integers(0, 2)
_SOME_KEYS = st.lists(st.sampled_from(KEYS), max_size=4, unique=True)
_BOOL = st.booleans()
_PROFILE = st.sampled_from(["p", "q"])
_ON_NODES = st.lists(_NAME, min_size=1, max_size=2, unique=True)
_CARDS = st.integers(1, 4)
_PLACED_CLASS = st.sampled_from(["A100", None])
_MEMORY_GB = st.integers(0, 80)
_PLACED_FABRIC = st.sampled_from(["", "f1"])
_VERSION = st.sampled_from(["", "v1"])
_STATES = st.sampled_from([PLACED, STARTING, READY, FAILED])
_SINCE = st.integers(0, 30)
_MESSAGE = st.sampled_from(["", "slow"])
_ENDPOINT = st.none() | st.just("http://10.0.0.1:8000")
_ONE_IN_SIX = st.integers(0, 5)
_ONE_IN_FIVE = st.integers(0, 4)


@st.composite
def rounds(draw: st.DrawFn) -> list[Inputs]:
    """A few rounds 10 s apart; each keeps most of the round before's objects (as a
    placer passes them), and changes some."""
    out: list[Inputs] = []
    nodes: dict[str, Node] = {}
    current: dict[tuple[str, int], Placement] = {}
    statuses: dict[tuple[str, int], ReplicaStatus] = {}
    cordons: dict[str, Cordon] = {}
    for i in range(draw(_ROUNDS)):
        now = T0 + timedelta(seconds=10 * i)
        boundary = now - POLICY.stale_after
        for name in draw(_SOME_NAMES):
            old = nodes.get(name)
            action = draw(_ACTIONS)
            if action == "drop":
                nodes.pop(name, None)
                continue
            when = {
                "boundary": boundary,
                # The boundary's instant in another offset: written otherwise.
                "offset": boundary.astimezone(PLUS_ONE),
            }.get(action, now - timedelta(seconds=draw(_AGE)))
            if old is not None and action != "put":
                nodes[name] = Node(
                    old.name, old.gpu_class, old.gpus, old.memory_gb, when, old.labels,
                    old.fabric, old.gpus_reserved,
                )  # fmt: skip
            else:
                nodes[name] = Node(
                    name,
                    draw(_CLASSES),
                    draw(_GPUS),
                    draw(_MEMORY),
                    when,
                    draw(_LABELS),
                    draw(_FABRIC),
                    draw(_RESERVED),
                )  # fmt: skip
        # Every node not touched still at the boundary moves with it (as a placer's
        # nodes do), and those older than it are moved to it.
        for name, n in list(nodes.items()):
            if n.reported_at < boundary:
                nodes[name] = Node(
                    n.name, n.gpu_class, n.gpus, n.memory_gb, boundary, n.labels, n.fabric,
                    n.gpus_reserved,
                )  # fmt: skip
        for key in draw(_SOME_KEYS):
            if draw(_BOOL) and key in current:
                del current[key]
                statuses.pop(key, None)
                continue
            current[key] = Placement(
                key[0],
                key[1],
                draw(_PROFILE),
                tuple(draw(_ON_NODES)),
                draw(_CARDS),
                draw(_PLACED_CLASS),
                draw(_MEMORY_GB),
                draw(_PLACED_FABRIC),
                draw(_VERSION),
            )
            statuses[key] = ReplicaStatus(
                draw(_STATES),
                now - timedelta(seconds=draw(_SINCE)),
                now - timedelta(seconds=40),
                message=draw(_MESSAGE),
                endpoint=draw(_ENDPOINT),
                reported=draw(_BOOL),
            )
        if draw(_BOOL):
            name = draw(_NAME)
            if cordons.pop(name, None) is None:
                cordons[name] = Cordon(name, CORDONED, "alice", "maintenance", now)
        placed = sorted(current.items())
        if len(placed) > 1 and draw(_ONE_IN_SIX) == 0:
            placed.reverse()  # out of key order: recorded in full
        out.append(
            Inputs(
                now,
                tuple(nodes.values()),
                tuple(p for _, p in placed),
                Lifecycle(
                    # In key order, as a placer reads them, or (now and then) not.
                    statuses=dict(statuses)
                    if draw(_ONE_IN_FIVE) == 0
                    else dict(sorted(statuses.items())),
                    cordons=dict(cordons),
                ),
            )
        )
    return out


def _columns(round_id: int, inputs: Inputs) -> dict[str, Any]:
    return {
        "id": round_id,
        "planned_at": inputs.now,
        "catalog_position": 7,
        "placed": 1,
        "removed": 0,
        "unplaced": 0,
    }


def _as_full(round_id: int, inputs: Inputs) -> RecordedRound:
    """The round decoded from its full record (what every round was before 0024)."""
    columns = full_record(inputs.nodes, inputs.current, POLICY, inputs.lifecycle)
    documents = {k: json.loads(v) for k, v in columns.items()}
    inventory = json.loads(inventory_json(inputs.nodes))
    return recorded_round(_columns(round_id, inputs), documents, inventory)


def _write(inputs: list[Inputs], every: int | None = None) -> list[tuple[int | None, str]]:
    """The rows a writer makes, as (base round, changes JSON); a full record's documents
    are rebuilt from its inputs when read (``_rebuild``)."""
    rows: list[tuple[int | None, str]] = []
    head: ChainHead | None = None
    for round_id, i in enumerate(inputs, start=1):
        boundary = i.now - POLICY.stale_after
        by_reference = changes_since(
            head, round_id, boundary=boundary, nodes=i.nodes, current=i.current,
            lifecycle=i.lifecycle,
        )  # fmt: skip
        if by_reference is None:
            rows.append((None, json.dumps(full_changes(boundary))))
            head = full_head(
                round_id, "digest", boundary=boundary, nodes=i.nodes, current=i.current,
                lifecycle=i.lifecycle,
            )  # fmt: skip
        else:
            changes, head = by_reference
            rows.append((round_id - 1, json.dumps(changes)))
    return rows


def _rebuild(
    inputs: list[Inputs], rows: list[tuple[int | None, str]], round_id: int
) -> tuple[RecordedRound, dict[str, Any]]:
    """Round ``round_id`` read as ``recorded_rounds`` reads it: a full record as it is,
    one by reference along its chain."""
    if rows[round_id - 1][0] is None:
        i = inputs[round_id - 1]
        full = {
            k: json.loads(v)
            for k, v in full_record(i.nodes, i.current, POLICY, i.lifecycle).items()
        }
        return recorded_round(
            _columns(round_id, i), full, json.loads(inventory_json(i.nodes))
        ), full
    chain = [round_id]
    while rows[chain[-1] - 1][0] is not None:
        base = rows[chain[-1] - 1][0]
        assert base is not None
        chain.append(base)
    first, *later = reversed(chain)
    keyframe = inputs[first - 1]
    columns = full_record(keyframe.nodes, keyframe.current, POLICY, keyframe.lifecycle)
    documents = upcast_round({k: json.loads(v) for k, v in columns.items()})
    rebuilt = Rebuilt.full(
        documents, json.loads(inventory_json(keyframe.nodes)), json.loads(rows[first - 1][1])
    )
    for link in later:
        rebuilt.apply(json.loads(rows[link - 1][1]))
    policy = json.loads(policy_json(POLICY, BY_REFERENCE))
    rebuilt_documents, nodes = rebuilt.documents(policy)
    return recorded_round(
        _columns(round_id, inputs[round_id - 1]), rebuilt_documents, nodes
    ), rebuilt_documents


@settings(max_examples=300, deadline=None)
@given(rounds(), st.booleans())
def test_a_round_rebuilt_from_its_chain_equals_its_full_record(
    inputs: list[Inputs], any_size: bool
) -> None:
    # A few nodes and placements change by more than a quarter in most rounds: half the
    # examples record by reference whatever the size of the changes.
    with patch.object(round_chain, "LARGE_FRACTION", 0 if any_size else 4):
        rows = _write(inputs)
    event(f"rows by reference: {sum(base is not None for base, _ in rows)}")
    for round_id, i in enumerate(inputs, start=1):
        got, documents = _rebuild(inputs, rows, round_id)
        assert got == _as_full(round_id, i)
        # The documents themselves, as the full record holds them (its current in key
        # order: one out of order is recorded in full).
        full = {
            k: json.loads(v)
            for k, v in full_record(i.nodes, i.current, POLICY, i.lifecycle).items()
        }
        if rows[round_id - 1][0] is not None:
            assert documents["current"] == full["current"]
            assert documents["lifecycle"] == full["lifecycle"]
            assert documents["reported_at"] == full["reported_at"]


def _steady(count: int) -> list[Inputs]:
    """``count`` rounds of 400 nodes at the boundary and 200 placements, one replica's
    state changing a round (two entries: one leaves ``starting``, the next enters it)."""
    out = []
    for i in range(count):
        now = T0 + timedelta(seconds=10 * i)
        nodes = tuple(
            Node(f"n{k:03}", "A100", 8, 512.0, now - POLICY.stale_after) for k in range(400)
        )
        current = tuple(Placement("m", r, "p", (f"n{r:03}",), 1, "A100") for r in range(200))
        statuses = {
            ("m", r): ReplicaStatus(READY if r != i % 200 else STARTING, T0, T0) for r in range(200)
        }
        out.append(Inputs(now, nodes, current, Lifecycle(statuses=statuses)))
    return out


def test_a_chain_is_a_bounded_length_and_holds_only_what_changed() -> None:
    inputs = _steady(2 * round_chain.KEYFRAME_EVERY + 3)
    rows = _write(inputs)
    bases = [base for base, _ in rows]
    full = [i for i, base in enumerate(bases, start=1) if base is None]
    assert full == [1, 1 + round_chain.KEYFRAME_EVERY, 1 + 2 * round_chain.KEYFRAME_EVERY]
    # A node at the boundary that stays there is no change; only the states that moved.
    second = json.loads(rows[1][1])
    assert second["reported_at"] == {} and second["nodes"] == [] and second["current"] == []
    assert [(s["model"], s["replica"], s["state"]) for s in second["statuses"]] == [
        ("m", 0, READY),
        ("m", 1, STARTING),
    ]
    for round_id in (2, round_chain.KEYFRAME_EVERY, len(inputs)):
        assert _rebuild(inputs, rows, round_id)[0] == _as_full(round_id, inputs[round_id - 1])


def test_a_large_change_is_recorded_in_full() -> None:
    inputs = _steady(3)
    moved = inputs[2]
    # Every placement's version pinned and every node's cards changed: most of the record.
    inputs[2] = Inputs(
        moved.now,
        tuple(Node(n.name, "H100", 4, n.memory_gb, n.reported_at) for n in moved.nodes),
        tuple(
            Placement(p.model, p.replica, p.profile, p.nodes, 1, "A100", version="v2")
            for p in moved.current
        ),
        moved.lifecycle,
    )  # fmt: skip
    assert [base for base, _ in _write(inputs)] == [None, 1, None]


def test_no_chain_follows_another_writers_round() -> None:
    inputs = _steady(2)
    boundary = inputs[0].now - POLICY.stale_after
    head = full_head(
        1, "d", boundary=boundary, nodes=inputs[0].nodes, current=inputs[0].current,
        lifecycle=inputs[0].lifecycle,
    )  # fmt: skip
    later = inputs[1]
    at = later.now - POLICY.stale_after
    kwargs: dict[str, Any] = {
        "boundary": at, "nodes": later.nodes, "current": later.current,
        "lifecycle": later.lifecycle,
    }  # fmt: skip
    assert changes_since(head, 2, **kwargs) is not None
    # Round 2 was written by another process: this writer's round is 3, recorded in full.
    assert changes_since(head, 3, **kwargs) is None
    assert changes_since(None, 2, **kwargs) is None


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ("[]", "changes is not a JSON object"),
        ('{"boundary": 3}', "changes boundary 3 is not a time"),
        ('{"boundary": "yesterday"}', "changes boundary 'yesterday' is not a time"),
        (
            '{"boundary": "2026-12-01T12:00:00+00:00", "nodes_gone": [1]}',
            "nodes_gone [1] is not a list of names",
        ),
        (
            '{"boundary": "2026-12-01T12:00:00+00:00", "nodes_gone": [], "nodes": [],'
            ' "reported_at": {}, "current_gone": [["m"]]}',
            "current_gone ['m'] is not a (model, replica) key",
        ),
    ],
)
def test_changes_that_are_not_what_a_writer_writes_are_unreadable(
    changes: str, reason: str
) -> None:
    inputs = _steady(1)[0]
    columns = full_record(inputs.nodes, inputs.current, POLICY, inputs.lifecycle)
    rebuilt = Rebuilt.full(
        upcast_round({k: json.loads(v) for k, v in columns.items()}),
        json.loads(inventory_json(inputs.nodes)),
        full_changes(inputs.now - POLICY.stale_after),
    )
    with pytest.raises(UnreadableRow, match=re.escape(reason)):
        rebuilt.apply(json.loads(changes))


def _values(data: Any) -> int:
    """How many values ``read_json`` counts in ``data`` (a dict's keys too)."""
    if isinstance(data, dict):
        return 1 + len(data) + sum(_values(v) for v in data.values())
    if isinstance(data, list):
        return 1 + sum(_values(v) for v in data)
    return 1


def test_a_full_record_of_200000_replicas_is_read_within_a_rounds_bounds() -> None:
    """Issue 42's scale: every placement and every replica's state of a round of 200,000
    replicas, recorded in full, is read (it held more values than ``STORED_LIMITS``
    reads, so such a round was unreadable), and its chain's rows with it."""
    from scheduler.persistence.row_decoding import ROUND_LIMITS, STORED_LIMITS

    replicas = 200_000
    placement = Placement(
        "t9-model-with-a-long-name-01234", 199_999, "a-profile-name", ("t9-node-99999",) * 2,
        8, "A100", 512, "f" * 32, "v" * 32, "moving: a reason of some length", "t9-model-x",
    )  # fmt: skip
    status = ReplicaStatus(
        STARTING, T0, T0, message="loading weights", endpoint="http://10.0.0.1:8000",
        effective_context_length=32768, context_detail="from the engine",
    )  # fmt: skip
    record = full_record((), (placement,), POLICY, Lifecycle(statuses={("m", 1): status}))
    for column in ("current", "lifecycle"):
        one = json.loads(record[column])
        values = replicas * _values(one["statuses"][0] if column == "lifecycle" else one[0])
        size = replicas * len(record[column])
        assert values > STORED_LIMITS.max_nodes or column == "lifecycle"
        assert values < ROUND_LIMITS.max_nodes / 2 and size < ROUND_LIMITS.max_bytes / 2, column


@settings(max_examples=150, deadline=None)
@given(rounds())
def test_nodes_planned_on_as_fresh_are_recorded_at_the_boundary(inputs: list[Inputs]) -> None:
    """A placer records the nodes it planned on (``IncrementalRounds.planned_nodes``): a
    fresh node with ``FRESH`` as its report time, the same object while it stays fresh.
    Recorded in full or by reference, such a round is the round of the same nodes at the
    freshness boundary, row for row."""
    at_fresh: dict[str, Node] = {}

    def planned(i: Inputs) -> Inputs:
        boundary = i.now - POLICY.stale_after
        nodes = []
        for n in i.nodes:
            # (A time at the boundary's instant in another offset is written otherwise:
            # not one a placer makes of a fresh node.)
            if n.reported_at != boundary or n.reported_at.utcoffset() != boundary.utcoffset():
                nodes.append(n)
                continue
            kept = at_fresh.get(n.name)
            if kept is None or round_chain._content(kept) != round_chain._content(n):
                kept = at_fresh[n.name] = reported_at(n, FRESH)
            nodes.append(kept)
        return Inputs(i.now, tuple(nodes), i.current, i.lifecycle)

    given_inputs = [planned(i) for i in inputs]
    with patch.object(round_chain, "LARGE_FRACTION", 0):
        assert _write(given_inputs) == _write(inputs)
    for i, g in zip(inputs, given_inputs, strict=True):
        boundary = i.now - POLICY.stale_after
        assert full_record(g.nodes, g.current, POLICY, g.lifecycle, boundary) == full_record(
            i.nodes, i.current, POLICY, i.lifecycle, boundary
        )
