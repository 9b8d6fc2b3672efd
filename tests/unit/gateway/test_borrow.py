"""gateway.stages.borrow and gateway.engineload: idle slots of others' deals, on the
engines' own counts, within the bound."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from gateway.engineload import MAX_BYTES, busy_of
from gateway.stages.borrow import FRESH_S, SPAN_S, Reading, lend, others
from gateway.table import Replica

R = {f"m/{i}": Replica(f"m/{i}", "m", f"http://h:{i}", 1.0, "p", slots=4) for i in range(2)}
DEAL = {"m/0": 2, "m/1": 2}


def at(*pairs: tuple[int, float]) -> tuple[Reading, ...]:
    """Readings (others, seconds into the span): the span is SPAN_S long."""
    return tuple(Reading(others, 10.0 + x * SPAN_S) for others, x in pairs)


def test_slots_idle_in_every_reading_over_the_span_are_lent_the_busiest_counts() -> None:
    readings = {"m/0": at((0, 0), (1, 0.3), (0, 0.6), (0, 1.0))}
    # The others had at most 1 request there over the span: 4 - 1 = 3 may be filled here.
    assert lend(DEAL, R, readings, 10.0 + SPAN_S) == {"m/0": 3, "m/1": 2}
    # The others fill their deal (or more): the deal stands, never less.
    busy = {"m/0": at((2, 0), (3, 1.0))}
    assert lend(DEAL, R, busy, 10.0 + SPAN_S) == DEAL
    # Idle a moment (a gateway refilling its slot): busy in a reading within the span.
    moment = {"m/0": at((2, 0), (0, 0.3), (2, 0.6), (0, 1.0))}
    assert lend(DEAL, R, moment, 10.0 + SPAN_S) == DEAL
    # The reading in force at the span's start counts; older ones do not.
    older = {"m/0": at((2, -1.0), (1, -0.05), (0, 0.3), (0, 1.0))}
    assert lend(DEAL, R, older, 10.0 + SPAN_S) == {"m/0": 3, "m/1": 2}


def test_readings_too_few_too_short_or_old_and_unknown_replicas_lend_nothing() -> None:
    readings = {"m/0": at((0, 0), (0, 1.0))}
    now = 10.0 + SPAN_S
    assert lend(DEAL, R, readings, now) == {"m/0": 4, "m/1": 2}
    assert lend(DEAL, R, {"m/0": at((0, 0), (0, 0.5))}, now) == DEAL  # too short a span
    assert lend(DEAL, R, {"m/0": at((0, 0))}, now) == DEAL
    assert lend(DEAL, R, readings, now + FRESH_S + 0.01) == DEAL
    assert lend(DEAL, {}, readings, now) == DEAL
    assert lend({}, R, readings, now) == {}
    assert lend(DEAL, R, {}, now) == DEAL


def test_this_gateways_own_requests_are_those_in_flight_before_and_after_the_reading() -> None:
    # 3 busy; this gateway had 2 in flight when it asked and 1 when the answer came: the
    # engine may have counted either, so at most 1 is surely its own: 2 are the others'.
    assert others(3, 2, 1) == 2
    assert others(1, 0, 2) == 1
    assert others(0, 2, 2) == 0


def test_the_engines_counts_are_read_from_metrics_or_llamacpp_slots() -> None:
    slots = [{"id": 0, "is_processing": True}, {"id": 1, "is_processing": False}]
    # /slots counts the slots busy, not the requests held back: not the whole count.
    assert busy_of("/slots", json.dumps(slots).encode()) == (1, False)
    assert busy_of("/slots", json.dumps([{"id": 0, "state": 1}]).encode()) == (1, False)
    assert busy_of("/slots", b'{"error": "slots disabled"}') is None
    assert busy_of("/slots", b"not json") is None
    vllm = (
        b'vllm:num_requests_running{model_name="m"} 2\n'
        b'vllm:num_requests_waiting{model_name="m"} 1.0\n'
        b'vllm:prompt_tokens_total{model_name="m"} 99\n'
    )
    assert busy_of("/metrics", vllm) == (3, True)
    llamacpp = b"llamacpp:requests_processing 2\nllamacpp:requests_deferred 3\n"
    assert busy_of("/metrics", llamacpp) == (5, True)
    assert busy_of("/metrics", b"# nothing here\n") is None
    assert busy_of("/metrics", b'vllm:num_requests_running{model_name="m"} NaN\n') is None


@pytest.mark.parametrize(
    ("path", "raw", "count"),
    [
        ("/slots", b"[" + b"{}," * (MAX_BYTES // 3 - 1) + b"{}]", None),  # 340,000 objects
        ("/slots", b"[" + b'{"is_processing":false},' * (MAX_BYTES // 24 - 1) + b"{}]", None),
        (
            "/slots",
            b'[{"is_processing":true,"n":[' + b"0," * (MAX_BYTES // 2 - 20) + b"0]}]",
            (1, False),
        ),
        ("/metrics", b"\n" * MAX_BYTES, None),  # a million lines
        ("/metrics", b"vllm:num_requests_running 0\n" * (MAX_BYTES // 28), None),
    ],
    ids=["empty-objects", "many-slots", "long-params", "newlines", "many-count-lines"],
)
def test_an_engines_answer_is_parsed_within_a_few_times_its_bytes(
    path: str, raw: bytes, count: tuple[int, bool] | None
) -> None:
    """A hostile engine's answer of ``MAX_BYTES`` that expands: on main ``json.loads``
    made every object and ``splitlines`` every line (tens of MB, 60-300 ms of the event
    loop on a loaded 2-core machine, every ``POLL_S`` a replica). Now what is not a
    count is skipped or refused, the objects made bounded by the replica's slots."""
    tracemalloc.start()
    try:
        found = busy_of(path, raw, 4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_BYTES
    # (the answer with one slot processing, however long its params, still says so)
    assert found == count


def test_a_clients_text_in_llamacpps_slots_does_not_make_it_no_count() -> None:
    """Builds of llama.cpp list each slot's prompt and generated text on ``/slots``: a
    client's text full of braces, or naming the state keys, is a string (its quotes
    escaped), and the count stands."""
    text = '{"is_processing": false, "state": 0}' * 2000
    slots = [{"id": i, "is_processing": i == 0, "prompt": text} for i in range(2)]
    assert busy_of("/slots", json.dumps(slots).encode(), 2) == (1, False)
