"""The gateway benchmark's own parts (``bench.gateway.side_by_side``), with real processes:
the upstream stub answers what the official OpenAI client expects, the load generator counts
every answer and every streamed event it was sent, and the figures are the differences they
claim to be. No timing is asserted here: speed is what the benchmark prints."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import openai
import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.gateway.control import Unavailable
from bench.gateway.load import percentiles
from bench.gateway.side_by_side import Figures, Load, Measured, Run, Settings, job_for, stub
from bench.gateway.targets import direct, ours

CHUNKS = 5
# A streamed answer's events: the role, CHUNKS tokens, the finish, and [DONE].
EVENTS = CHUNKS + 3


@pytest.fixture
def stub_port(tmp_path: Path) -> Iterator[int]:
    settings = Settings(chunks=CHUNKS, chunk_delay_ms=0.0)
    with stub(settings, tmp_path) as (_, port):
        yield port


def test_the_stub_answers_the_official_openai_client_plain_and_streamed(stub_port: int) -> None:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{stub_port}/v1", api_key="unused")
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "user", "content": "hello"}
    ]
    plain = client.chat.completions.create(model="bench-model", messages=messages)
    assert plain.choices[0].message.content == "Hello from the stub."
    assert plain.usage is not None and plain.usage.completion_tokens == 5
    chunks = list(
        client.chat.completions.create(model="bench-model", messages=messages, stream=True)
    )
    tokens = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert tokens == [f" tok{i}" for i in range(CHUNKS)]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert [m.id for m in client.models.list()] == ["bench-model"]


def test_the_stub_ends_a_stream_asked_for_its_usage_with_the_usage_event(stub_port: int) -> None:
    # As vLLM's and OpenAI's: our gateway asks for it on every stream and cuts it out
    # again, and the benchmark must make it pay for that as an engine would.
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{stub_port}/v1", api_key="unused")
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "user", "content": "hello"}
    ]
    asked = list(
        client.chat.completions.create(
            model="bench-model",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert asked[-1].choices == []
    assert asked[-1].usage is not None and asked[-1].usage.completion_tokens == CHUNKS
    plain = list(
        client.chat.completions.create(model="bench-model", messages=messages, stream=True)
    )
    assert all(c.usage is None for c in plain) and len(plain) == len(asked) - 1


@pytest.mark.parametrize("stream", [False, True])
def test_the_load_generator_counts_every_answer_and_streamed_event(
    stub_port: int, stream: bool
) -> None:
    target = direct(stub_port)
    load = Load(target, job_for(target, 4, stream, Settings(), requests=60))
    try:
        first, second = load.window(), load.window()
    finally:
        load.close()
    for window in (first, second):
        assert window["errors"] == 0, window["error_samples"]
        assert window["requests"] == 60
        assert window["latency"]["n"] == 60
        assert window["events"] == (60 * EVENTS if stream else 0)
        # Each answer's events are EVENTS - 1 gaps apart.
        assert window["gap"].get("n", 0) == (60 * (EVENTS - 1) if stream else 0)
        assert 0 < window["latency"]["p50"] <= window["latency"]["p99"] <= window["latency"]["max"]


def test_the_load_generator_counts_refusals_as_errors_not_as_latencies(stub_port: int) -> None:
    target = direct(stub_port)
    target.path = "/v1/not-a-route"
    load = Load(target, job_for(target, 2, False, Settings(), requests=10))
    try:
        window = load.window()
    finally:
        load.close()
    assert window["requests"] == 0
    assert window["errors"] == 10
    assert window["error_samples"][0].startswith("404")


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_the_stub_refuses_an_oversized_head_or_body_and_closes(stub_port: int) -> None:
    huge_head = b"POST /v1/chat/completions HTTP/1.1\r\nx-pad: " + b"a" * 70_000
    assert _raw(stub_port, huge_head).startswith(b"HTTP/1.1 413")
    huge_body = b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2000000\r\n\r\n" + b"{" * 10
    assert _raw(stub_port, huge_body).startswith(b"HTTP/1.1 413")


@given(st.lists(st.floats(min_value=0, max_value=10, allow_nan=False), min_size=1, max_size=300))
def test_percentiles_are_ordered_values_of_the_sample(values: list[float]) -> None:
    got = percentiles(values)
    assert got["p50"] <= got["p90"] <= got["p99"] <= got["max"] == max(values)
    assert {got["p50"], got["p90"], got["p99"]} <= set(values)
    assert got["n"] == len(values)
    # A float sum can round either way: n equal tiny values may average a hair below them.
    assert min(values) - 1e-9 <= got["mean"] <= max(values) + 1e-9


def test_percentiles_of_nothing_are_empty() -> None:
    assert percentiles([]) == {}


def _window(p50: float, p99: float, requests: int = 100) -> dict[str, object]:
    return {
        "requests": requests,
        "errors": 0,
        "seconds": 1.0,
        "client_cpu": 0.1,
        "latency": {"p50": p50, "p99": p99},
        "first": {},
        "gap": {},
    }


def test_added_latency_is_the_median_over_rounds_of_each_rounds_difference() -> None:
    run = Run(Settings(repeats=3, concurrency=(1,), modes=("plain",)))
    # Direct: 1, 2, 3 ms; through the gateway: 1.5, 2.2, 9 ms in the same rounds.
    for rnd, (ref, mine) in enumerate([(1.0, 1.5), (2.0, 2.2), (3.0, 9.0)]):
        run.measured.append(Measured("direct", rnd, 1, "plain", _window(ref, ref), 0, 0.01, 0))
        run.measured.append(Measured("gw", rnd, 1, "plain", _window(mine, mine), 0.2, 0, 0))
    fig = Figures(run)
    assert fig.added("gw", 1, "plain", "latency", "p50") == pytest.approx(0.5)
    assert fig.rate("gw", 1, "plain") == 100
    assert fig.cpu("gw", 1, "plain") == pytest.approx(0.002)
    assert fig.cpu("direct", 1, "plain") == pytest.approx(0.0001)  # the stub's, on direct
    assert fig.added("gw", 16, "plain", "latency", "p50") is None  # never measured


@pytest.mark.slow  # (tests/xdist_groups.py: handed out first)
def test_a_variant_that_cannot_start_is_named_and_leaves_no_control_plane_running(
    stub_port: int, tmp_path: Path
) -> None:
    """A benchmark that gives up on one gateway must not leave its control plane (a real
    ``llmgw serve``) running after the run: on a 2-core machine a stray server skews every
    later measurement. A command line that does not format is named before any control
    plane is started for it: no process at all, not even one stopped again."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(Unavailable, match="nope"):
        ours(
            "{llmgw} gateway --port {nope}",
            Settings().llmgw,
            f"http://127.0.0.1:{stub_port}",
            tmp_path,
            key="ours:bad",
            label="llmgw bad",
        )
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert [p.cmdline() for p in left if p.is_running() and p.status() != "zombie"] == []
    assert not (tmp_path / "control-ours-bad").exists(), "a control plane was started"
