"""The gateway's failure paths end to end, on one cluster shared by the module: a real
`llmgw serve`, an agent with sim engines, two real `llmgw gateway`s and the official
OpenAI client.

Each test has models of its own (a test that kills an engine kills its own model's),
so they share the cluster honestly: none depends on another's leftovers. Waits are on
conditions (the engine's /metrics, the gateway's log and /routing), never on sleeps;
bounds only catch hangs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.agents import Cluster, eventually
from tests.e2e.gateways import GatewayProc, GatewayTokens, gateway_cluster

pytestmark = pytest.mark.slow

ROUNDS = ["--with-scheduler", "--interval", "0.3", "--stream-poll", "0.1"]
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Where do replicas run?"}]


def sim(name: str, *args: str, replicas: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "source": f"sim/{name}",
        "scaling": {"min": replicas, "max": max(replicas, 1)},
        "context_length": 8192,
        "max_output": 4096,
        "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM", "args": list(args)}],
        **extra,
    }


MODELS = [
    sim("backup"),
    # One slot, a token every 50 ms: a long answer holds the slot for seconds.
    sim("slow", "--slots", "1", "--token-delay", "0.05"),
    sim("fragile", "--token-delay", "0.05", fallbacks=["backup"]),
    # Placed, and never ready while the module runs.
    sim("never", "--startup-delay", "600"),
]
# Added by its test at runtime (PUT raises its min from 0): a declared model is the
# file's to change.
LATE = sim("late", "--startup-delay", "1", replicas=0)


class Setup:
    def __init__(self, c: Cluster, gw: GatewayProc, tokens: GatewayTokens, work: Path) -> None:
        self.c, self.gw, self.tokens, self.work = c, gw, tokens, work
        self.client = gw.openai(tokens.client)

    def engine(self, model: str) -> dict[str, Any]:
        """The live engine record (pid, port, log) of the model's one replica."""
        found = [r for r in self.c.agents["n1"].live_engines() if model in r["argv"]]
        assert len(found) == 1, found
        return found[0]

    def endpoint(self, model: str) -> str:
        found = self.gw.routing()["models"][model]["replicas"]
        assert len(found) == 1, found
        endpoint: str = found[0]["endpoint"]
        return endpoint


def engine_metrics(endpoint: str) -> dict[str, float]:
    text = httpx.get(endpoint + "/metrics", timeout=10).text
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^([a-z_:]+)\{[^}]*\} ([0-9.]+)$", text, re.M)
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("gwfail")
    shutil.copy(sqlite_template, work / "llmgw.db")
    with gateway_cluster(work, f"sqlite:///{work / 'llmgw.db'}", ["n1"], MODELS, ROUNDS) as (
        c,
        gw,
        tokens,
    ):
        c.agent("n1", gpus="SIM:8")
        eventually(
            lambda: all(gw.ready(m, 1) for m in ("backup", "slow", "fragile")),
            "backup, slow and fragile ready at the gateway",
        )
        yield Setup(c, gw, tokens, work)


def test_a_stream_broken_after_its_first_token_ends_with_one_error_event_and_no_retry(
    setup: Setup,
) -> None:
    """The engine dies mid-answer: the client gets what was sent, then the documented
    terminal event (the SDK raises it), and the gateway tries nobody else, not even
    the fallback, because bytes were sent."""
    engine = setup.engine("fragile")
    stream = setup.client.chat.completions.create(
        model="fragile", messages=HI, max_tokens=2000, stream=True
    )
    received: list[str] = []
    with pytest.raises(openai.APIError) as broken:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                received.append(chunk.choices[0].delta.content)
                if len(received) == 1:
                    os.killpg(engine["pid"], signal.SIGKILL)
    assert received, "the first token reached the client before the engine died"
    assert len(received) < 2000
    assert "stopped in the middle of the answer" in broken.value.message
    assert isinstance(broken.value.body, dict)
    assert broken.value.body["code"] == "stream_interrupted"

    line = eventually(
        lambda: [x for x in setup.gw.logs("gateway.request") if x["model_asked"] == "fragile"],
        "the broken request's log line",
    )[-1]
    assert line["outcome"] == "failed" and line["attempts"] == 1
    assert line["model_served"] == "fragile" and line["replica"] == "fragile/0"
    assert [x["request_id"] for x in setup.gw.logs("gateway.stream_broken")] == [line["request_id"]]
    # No fallback was counted for it.
    assert 'to="backup"' not in setup.gw.get("/metrics").text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_client_that_disconnects_cancels_its_upstream_request(setup: Setup, stream: bool) -> None:
    """The engine (one slot) sees its request abandoned when the client goes away, and
    its slot serves the next request: the gateway closed the upstream connection."""
    endpoint = setup.endpoint("slow")
    before = engine_metrics(endpoint)
    assert before["vllm:num_requests_running"] == 0
    body = {"model": "slow", "messages": HI, "max_tokens": 4000, "stream": stream}
    if stream:
        auth = {"Authorization": f"Bearer {setup.tokens.client}"}
        url = setup.gw.url + "/v1/chat/completions"
        with (
            httpx.Client(timeout=60) as http,
            http.stream("POST", url, json=body, headers=auth) as answer,
        ):
            assert answer.status_code == 200
            # The headers came with the first token: the engine is generating (4,000
            # tokens at 50 ms: minutes). Leaving the block closes the connection.
            # (The iterator is kept: one dropped closes the connection, in httpcore.)
            lines = answer.iter_lines()
            assert next(lines).startswith("data:")
            assert engine_metrics(endpoint)["vllm:num_requests_running"] == 1
    else:
        raw = json.dumps(body).encode()
        host, port = setup.gw.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                b"Authorization: Bearer " + setup.tokens.client.encode() + b"\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw
            )
            # The engine holds the request (minutes of work); then the client hangs up.
            eventually(
                lambda: engine_metrics(endpoint)["vllm:num_requests_running"] == 1,
                "the engine generating the request",
            )

    def cancelled() -> bool:
        now = engine_metrics(endpoint)
        return (
            now["sim_requests_cancelled_total"] == before["sim_requests_cancelled_total"] + 1
            and now["vllm:num_requests_running"] == 0
        )

    eventually(cancelled, "the engine saw the request cancelled and freed its slot")
    # The freed slot answers the next request (it would wait minutes otherwise).
    freed = setup.client.with_options(timeout=30).chat.completions.create(
        model="slow", messages=HI, max_tokens=2
    )
    assert freed.choices[0].message.content
    line = eventually(
        lambda: [x for x in setup.gw.logs("gateway.request") if x["outcome"] == "cancelled"],
        "the cancelled request's log line",
    )[-1]
    assert line["model_asked"] == "slow" and line["stream"] is stream


def test_a_request_for_a_starting_model_waits_and_past_its_deadline_gets_503(
    setup: Setup,
) -> None:
    """`late` has no replica: a request waits (and the gateway says so) until the
    operator raises its min and the replica is ready, then is answered. `never` stays
    starting: a gateway whose max_wait is 1 s answers 503 in OpenAI's shape with
    Retry-After, naming the model and what is starting."""
    setup.c.add(LATE)
    eventually(lambda: "late" in setup.gw.routing()["models"], "late in the gateway's table")
    answers: list[Any] = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            setup.client.with_options(timeout=120).chat.completions.with_raw_response.create(
                model="late", messages=HI, max_tokens=3
            )
        )
    )
    waiter.start()
    eventually(
        lambda: [x for x in setup.gw.logs("gateway.waiting") if x["model"] == "late"],
        "the request waiting for late",
    )
    assert answers == [] and waiter.is_alive()
    with setup.c.server.client(setup.c.tokens.operator) as ops:
        answer = ops.put("/v1/catalog/models/late", json={**LATE, "scaling": {"min": 1}})
        assert answer.status_code == 200, answer.text
    waiter.join(120)
    assert len(answers) == 1
    assert answers[0].headers["x-llmgw-model"] == "late"
    assert answers[0].parse().choices[0].message.content
    # Log lines reach the file within tens of ms (written together: llmgw.logs).
    (line, *_) = eventually(
        lambda: [x for x in setup.gw.logs("gateway.request") if x["model_asked"] == "late"][::-1],
        "the late request's log line",
    )
    assert line["outcome"] == "ok" and line["waited_ms"] > 0

    # A second gateway on the same cluster, whose requests wait 1 s at most.
    settings = setup.work / "impatient.toml"
    settings.write_text('[gateway]\nmax_wait = "1s"\n')
    impatient = GatewayProc(
        setup.work, setup.c.server.url, setup.tokens.gateway, "--settings", str(settings)
    )
    impatient.admin = setup.c.tokens.reader
    impatient.start()
    try:
        eventually(
            lambda: impatient.routing()["models"].get("never", {}).get("starting") == 1,
            "never starting, as the second gateway sees it",
        )
        with pytest.raises(openai.APIStatusError) as refused:
            impatient.openai(setup.tokens.client).chat.completions.create(
                model="never", messages=HI, max_tokens=2
            )
    finally:
        impatient.stop()
    e = refused.value
    assert e.status_code == 503 and e.response.headers["retry-after"] == "5"
    assert isinstance(e.body, dict)
    assert set(e.body) == {"message", "type", "param", "code"}
    assert e.body["code"] == "no_replica_available" and e.body["param"] == "model"
    assert "'never'" in e.message and "starting: 1" in e.message


def test_a_stopping_gateway_finishes_the_requests_in_flight(setup: Setup) -> None:
    """SIGTERM while a streamed answer runs: the answer completes, then the gateway
    exits 0."""
    # (This one also shows --admin-open: /routing and /metrics without a token.)
    gw = GatewayProc(setup.work, setup.c.server.url, setup.tokens.gateway, "--admin-open")
    gw.start()
    try:
        assert gw.get("/metrics", headers={}).status_code == 200
        # slow's one slot at 50 ms a token: 60 tokens take 3 s.
        eventually(lambda: gw.ready("slow", 1), "slow at the stopping gateway")
        stream = gw.openai(setup.tokens.client).chat.completions.create(
            model="slow", messages=HI, max_tokens=60, stream=True
        )
        chunks = iter(stream)
        first = next(chunks)
        assert first.choices
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        rest = list(chunks)
        words = "".join(
            c.choices[0].delta.content or "" for c in [first, *rest] if c.choices
        ).split()
        assert len(words) == 60
        assert rest[-1].choices[0].finish_reason == "length"
        assert gw.proc.wait(60) == 0
    finally:
        gw.stop()


def test_a_gateway_that_has_not_heard_from_the_control_plane_says_starting_not_bad_key(
    setup: Setup,
) -> None:
    """Before its first table a gateway knows no token: a valid client key (or reader
    key) is told to retry (503, Retry-After), never that it is invalid."""
    with socket.socket() as s:  # a port nothing listens on: the control plane is away
        s.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{s.getsockname()[1]}"
    gw = GatewayProc(setup.work, nowhere, setup.tokens.gateway)
    gw.admin = setup.c.tokens.reader
    gw.start(synced=False)
    try:
        assert gw.get("/healthz").status_code == 503
        with pytest.raises(openai.APIStatusError) as refused:
            gw.openai(setup.tokens.client).chat.completions.create(
                model="quick", messages=HI, max_tokens=2
            )
        e = refused.value
        assert e.status_code == 503 and e.response.headers["retry-after"] == "1"
        assert isinstance(e.body, dict) and e.body["code"] == "gateway_starting"
        routing = gw.get("/routing")
        assert routing.status_code == 503 and "starting" in routing.json()["error"]["message"]
    finally:
        gw.stop()
