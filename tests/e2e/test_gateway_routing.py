"""The gateway's routing profiles and a node drain end to end, on one cluster shared by
the module: a real `llmgw serve`, agents with sim engines on cards of several classes
(so a model can have a fast and a slow replica, and a drained node's replica has
somewhere to go), a real `llmgw gateway` and the official OpenAI client.

Each test has models of its own, so the cluster is shared honestly. Waits are on
conditions, never on sleeps; bounds only catch hangs.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.agents import Cluster, eventually
from tests.e2e.gateways import GatewayProc, GatewayTokens, gateway_cluster

pytestmark = pytest.mark.slow

ROUNDS = ["--with-scheduler", "--interval", "0.3", "--stream-poll", "0.1"]
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Where do replicas run?"}]


def profile(name: str, gpu_class: str, *args: str) -> dict[str, Any]:
    return {"name": name, "engine": "sim", "gpu_class": gpu_class, "args": list(args)}


def model(name: str, *profiles: dict[str, Any], replicas: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "source": f"sim/{name}",
        "scaling": {"min": replicas, "max": replicas},
        "context_length": 8192,
        "max_output": 4096,
        "profiles": list(profiles),
        **extra,
    }


MODELS = [
    model("backup", profile("sim", "SIM")),
    # Two replicas on two classes of card: one answers at once, one takes 1 s a token.
    model(
        "quick",
        profile("fast", "SIMF"),
        profile("slow", "SIMS", "--token-delay", "1"),
        replicas=2,
        routing_profile="latency",
    ),
    # Never within its SLO: 0.4 s a token, 200 ms to the first one promised.
    model(
        "laggy",
        profile("sim", "SIM", "--token-delay", "0.4"),
        routing_profile="latency",
        slo={"ttft_p99": "200ms"},
        fallbacks=["backup"],
    ),
    # On its own class of card, two nodes of it: a drain has somewhere to go.
    model("steady", profile("sim", "SIMD", "--token-delay", "0.1")),
]
# Added at runtime by its test (its min is changed by PUT: a declared model is the
# file's to change).
STICKY = model("sticky", profile("sim", "SIM"), replicas=3, routing_profile="session")


class Setup:
    def __init__(self, c: Cluster, gw: GatewayProc, tokens: GatewayTokens) -> None:
        self.c, self.gw, self.tokens = c, gw, tokens
        self.client = gw.openai(tokens.client)

    def served(self, model: str, **kw: Any) -> tuple[str, str]:
        """(model, replica) that answered one short request."""
        raw = self.client.chat.completions.with_raw_response.create(
            model=model, messages=HI, max_tokens=kw.pop("max_tokens", 1), **kw
        )
        return raw.headers["x-llmgw-model"], raw.headers["x-llmgw-replica"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("gwroute")
    shutil.copy(sqlite_template, work / "llmgw.db")
    nodes = ["n1", "n2", "n3", "n4", "n5"]
    with gateway_cluster(work, f"sqlite:///{work / 'llmgw.db'}", nodes, MODELS, ROUNDS) as (
        c,
        gw,
        tokens,
    ):
        c.agent("n1", gpus="SIM:5")
        c.agent("n2", gpus="SIMF:1")
        c.agent("n3", gpus="SIMS:1")
        # A drained replica's engine gets a minute to finish its requests.
        c.agent("n4", "--stop-grace", "60", gpus="SIMD:1")
        c.agent("n5", "--stop-grace", "60", gpus="SIMD:1")
        eventually(
            lambda: gw.ready("backup", 1) and gw.ready("quick", 2) and gw.ready("laggy", 1),
            "backup, quick and laggy ready at the gateway",
        )
        yield Setup(c, gw, tokens)


def test_session_routing_sticks_to_a_replica_and_moves_only_when_it_leaves(
    setup: Setup,
) -> None:
    gw = setup.gw
    setup.c.add(STICKY)
    eventually(lambda: len(gw.replicas("sticky")) == 3, "three sticky replicas at the gateway")
    keys = [f"user-{i}" for i in range(12)]
    first = {k: setup.served("sticky", user=k)[1] for k in keys}
    assert len(set(first.values())) == 3, first  # the keys spread over the replicas
    for _ in range(2):
        assert {k: setup.served("sticky", user=k)[1] for k in keys} == first
    # The x-session-id header is the key, and wins over `user`.
    assert {
        k: setup.served("sticky", user="someone-else", extra_headers={"x-session-id": k})[1]
        for k in keys
    } == first

    # One replica leaves (the operator lowers min to 2): its keys move, no other does.
    before = set(gw.replicas("sticky"))
    with setup.c.server.client(setup.c.tokens.operator) as ops:
        answer = ops.put(
            "/v1/catalog/models/sticky", json={**STICKY, "scaling": {"min": 2, "max": 2}}
        )
        assert answer.status_code == 200, answer.text
    eventually(lambda: len(gw.replicas("sticky")) == 2, "a sticky replica gone from the table")
    (left,) = before - set(gw.replicas("sticky"))
    after = {k: setup.served("sticky", user=k)[1] for k in keys}
    moved = {k for k in keys if after[k] != first[k]}
    assert moved == {k for k in keys if first[k] == left}, (first, after, left)
    assert moved and all(after[k] != left for k in keys)


def test_latency_routing_prefers_the_faster_replica(setup: Setup) -> None:
    """`quick` has a replica on a fast card and one on a slow one (1 s a token). Each is
    measured once (a replica not measured yet is predicted 0), then every request
    goes to the fast one."""
    by_profile = {
        p["profile"]: f"quick/{p['replica']}" for p in setup.c.placements() if p["model"] == "quick"
    }
    fast, slow = by_profile["fast"], by_profile["slow"]
    served = [setup.served("quick", max_tokens=2)[1] for _ in range(8)]
    assert set(served[:2]) == {fast, slow}
    assert served[2:] == [fast] * 6
    replicas = {r["replica"]: r for r in setup.gw.routing()["models"]["quick"]["replicas"]}
    assert replicas[slow]["predicted_ttft_s"] >= 2.0 > replicas[fast]["predicted_ttft_s"]
    reasons = [c["reason"] for c in setup.gw.routing()["models"]["quick"]["recent"]]
    assert reasons[-1].startswith("latency: predicted TTFT")


def test_latency_routing_goes_to_the_fallbacks_before_sending_when_none_meets_the_slo(
    setup: Setup,
) -> None:
    """`laggy` takes 0.8 s to its first token of a two-token answer against a 200 ms
    slo.ttft_p99. Once measured, the next request goes to its fallback before anything
    is sent to it; its own replica answers when no fallback can."""
    assert setup.served("laggy", max_tokens=2) == ("laggy", "laggy/0")  # measured now
    ids = []
    for stream in (False, True):
        raw = setup.client.chat.completions.with_raw_response.create(
            model="laggy", messages=HI, max_tokens=2, stream=stream
        )
        assert raw.headers["x-llmgw-model"] == "backup"
        ids.append(raw.headers["x-request-id"])
    # Log lines reach the file within tens of ms (written together: llmgw.logs).
    lines = eventually(
        lambda: (
            found
            if len(found := [x for x in setup.gw.logs("gateway.request") if x["request_id"] in ids])
            == 2
            else None
        ),
        "both requests' log lines",
    )
    assert [x["attempts"] for x in lines] == [1, 1]  # one send each: to backup
    assert "'laggy' predicted above its slo.ttft_p99" in lines[-1]["tried"][0]
    recent = setup.gw.routing()["models"]["laggy"]["recent"]
    assert recent[-1]["replica"] is None
    assert recent[-1]["reason"].endswith("(above slo.ttft_p99 0.2s): not sent, its fallbacks first")
    metrics = setup.gw.get("/metrics").text
    assert 'llmgw_gateway_fallbacks_total{model="laggy",to="backup"} 2.0' in metrics


def test_a_drained_nodes_replica_finishes_the_request_in_flight(setup: Setup) -> None:
    """A streamed answer runs through the gateway on `steady`'s replica while its node
    is drained: the replacement starts on the other node, the old replica leaves the
    table (no new request goes to it) and is stopped, and the answer in flight
    completes, whole."""
    gw, c = setup.gw, setup.c
    eventually(lambda: len(gw.replicas("steady")) == 1, "steady ready at the gateway")
    (old,) = [p for p in c.placements() if p["model"] == "steady"]
    node = old["nodes"][0]
    (engine,) = [r for r in c.agents[node].live_engines() if "steady" in r["argv"]]
    stream = setup.client.with_options(timeout=120).chat.completions.create(
        model="steady", messages=HI, max_tokens=200, stream=True
    )
    chunks = iter(stream)
    first = next(chunks)
    with c.server.client(c.tokens.operator) as ops:
        answer = ops.post(f"/v1/nodes/{node}/drain", params={"reason": "kernel upgrade"})
        assert answer.status_code == 200, answer.text

    # The engine's log is the agent's to name (derived from its key, never from a record).
    (log_path,) = (c.agents[node].state_dir / "logs").glob(f"steady-*-{engine['replica']}.log")

    def stopping() -> str | None:
        text = log_path.read_text(errors="replace")
        found = [x for x in text.splitlines() if "sim engine: stopping" in x]
        return found[0] if found else None

    # The engine was told to stop while the answer was being written (200 tokens at
    # 100 ms: 20 s); it lets it finish.
    said = eventually(stopping, "the drained replica's engine told to stop")
    assert "; 1 request(s) in flight finish first" in said
    rest = list(chunks)
    text = "".join(ch.choices[0].delta.content or "" for ch in [first, *rest] if ch.choices)
    assert len(text.split()) == 200
    assert rest[-1].choices[0].finish_reason == "length"
    # The replacement serves, on the other node.
    new = eventually(
        lambda: [p for p in c.placements() if p["model"] == "steady" and p["state"] == "ready"],
        "the replacement ready",
    )
    assert new[0]["nodes"] != [node]
    assert setup.served("steady")[1] == f"steady/{new[0]['replica']}"
    line = eventually(
        lambda: next((x for x in gw.logs("gateway.request") if x["model_asked"] == "steady"), None),
        "steady's log line",
    )
    assert line["outcome"] == "ok" and line["completion_tokens"] == 200
