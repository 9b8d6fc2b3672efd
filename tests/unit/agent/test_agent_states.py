"""What each node says of a replica: the head speaks for a gang, a worker only of its failure."""

from __future__ import annotations

from agent.placements import Key
from agent.state import Record
from agent.states import replica_states

GANG = Key("big", 0)


def record(**kw: object) -> Record:
    fields: dict[str, object] = {
        "model": "big", "replica": 0, "fingerprint": "f", "engine": "sim", "argv": (),
        "pid": 1, "start_time": 0.0, "port": 8000, "endpoint": "http://10.0.0.1:8000",
        "devices": (0,), "started_at": 0.0, **kw,
    }  # fmt: skip
    return Record(**fields)  # type: ignore[arg-type]


def test_a_head_gathering_its_workers_reports_its_endpoint_so_they_can_find_it() -> None:
    (state,) = replica_states({GANG: record(nnodes=2)}, {}, node="n1")
    assert state["state"] == "starting" and state["endpoint"] == "http://10.0.0.1:8000"
    assert state["message"] == "sim on port 8000, gathering 1 worker node(s) at port 8001"
    (alone,) = replica_states({GANG: record()}, {}, node="n1")
    assert "endpoint" not in alone  # one node: the endpoint is reported once ready


def test_a_worker_is_silent_while_it_runs_or_waits_and_names_its_rank_when_it_fails() -> None:
    running = record(rank=1, nnodes=2)
    assert replica_states({GANG: running}, {}, node="n2") == []
    assert replica_states({}, {GANG: "waiting for the head"}, node="n2", worker_keys={GANG}) == []
    failed = running.exited(5.0, -9, "the engine was killed by SIGKILL")
    (state,) = replica_states({GANG: failed}, {}, node="n2")
    assert state == {
        "model": "big",
        "replica": 0,
        "state": "failed",
        "message": "node n2 (rank 1): the engine was killed by SIGKILL",
    }
    # Once the control plane holds it failed, the worker need not say so again.
    assert replica_states({GANG: failed}, {}, node="n2", known_failed={GANG}) == []


def test_messages_are_printable_and_bounded() -> None:
    noisy = record().exited(1.0, 1, "\x1b[31m" + "x" * 5000)
    (state,) = replica_states({GANG: noisy}, {}, node="n1")
    assert state["message"].isprintable() and len(state["message"]) == 1000
