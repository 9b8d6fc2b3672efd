"""A real llama.cpp engine end to end: `llmgw serve` with the scheduler, two CPU agents
(`--gpus none`) and the llama-server they start on a tiny random-weight model.

One cluster for the module (the tests run in order on one worker: ``xdist_group``):
a CPU profile whose args set ``--ctx-size 2048 --parallel 4`` (512 tokens a slot,
under the catalog's context_length 1024: the seed's arithmetic, warned), a model
whose file is missing, engine-check, a drain, and a crash last (a crash may move the
replica, and the node it failed on is then avoided for a minute).

A real `llmgw gateway` follows the cluster: the OpenAI calls (the official client)
and `llmgw engine-check --gateway` go through it, and it admits a prompt by the
smaller of the catalog's context_length and what one slot of the engine gives,
counted by the engine's own /tokenize.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
from openai.types.chat import ChatCompletionMessageParam

from agent.processes import healthy
from tests.e2e.agents import Cluster, eventually
from tests.e2e.gateways import GatewayProc, GatewayTokens, gateway_cluster

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow, pytest.mark.xdist_group("llamacpp")]

ROUNDS = ["--with-scheduler", "--interval", "0.3"]
ARGS = ["--ctx-size", "2048", "--parallel", "4"]
ARITHMETIC = "--ctx-size 2048 / --parallel 4 = 512"


def tiny_model(path: Path) -> dict[str, Any]:
    return {
        "name": "tiny",
        "source": str(path),
        "context_length": 1024,
        "capabilities": {"tools": True},
        "scaling": {"min": 1},
        "profiles": [{"name": "cpu", "engine": "llamacpp", "args": ARGS}],
    }


BROKEN = {
    "name": "broken",
    "source": "/nonexistent/llmgw-missing.gguf",
    "scaling": {"min": 1},
    "profiles": [{"name": "cpu", "engine": "llamacpp"}],
}


Stack = tuple[Cluster, GatewayProc, GatewayTokens]


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    sqlite_template: Path,
    llama_server: str,
    tiny_gguf: Path,
) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("llamacpp")
    db = workdir / "llmgw.db"
    db.write_bytes(sqlite_template.read_bytes())
    models = [tiny_model(tiny_gguf), BROKEN]
    with gateway_cluster(workdir, f"sqlite:///{db}", ["n1", "n2"], models, ROUNDS) as (c, gw, t):
        for node in ("n1", "n2"):
            # The agent finds the server itself (the package's, here); a short back-off
            # so that a killed engine comes back within the test.
            c.agent(node, "--restart-backoff", "1", gpus="none")
        yield c, gw, t


@pytest.fixture(scope="module")
def llama(stack: Stack) -> Cluster:
    return stack[0]


def gateway_sees(gw: GatewayProc, effective: int) -> dict[str, Any] | None:
    """tiny's replica in the gateway's table, once it carries the engine's figure."""
    found = gw.routing()["models"].get("tiny")
    replicas = [] if found is None else found["replicas"]
    if len(replicas) == 1 and replicas[0]["effective_context_length"] == effective:
        return dict(replicas[0])
    return None


def history(c: Cluster, model: str) -> list[dict[str, Any]]:
    done = c.cli("history", "--placements", "--model", model, "--json")
    assert done.returncode == 0, done.stderr
    return [e for e in json.loads(done.stdout) if e.get("log") == "placements"]


def ready(c: Cluster, model: str) -> dict[str, Any] | None:
    placed = c.ready(model, 1)
    return placed[0] if placed else None


def engine_of(c: Cluster, model: str) -> tuple[str, dict[str, Any]]:
    """(node, the agent's record) of the model's live engine."""
    for node, agent in c.agents.items():
        for record in agent.live_engines():
            if record["model"] == model:
                return node, record
    raise AssertionError(f"no live engine of {model}")


def test_a_cpu_replica_starts_becomes_ready_serves_openai_and_says_its_real_context(
    stack: Stack, llama_server: str, tiny_gguf: Path
) -> None:
    c = stack[0]
    placement = eventually(lambda: ready(c, "tiny"), "tiny[0] ready", timeout=180)
    # The agent ran the server it found, with the profile's args after its own.
    _, record = engine_of(c, "tiny")
    argv = record["argv"]
    assert argv[0] == llama_server
    assert argv[1:3] == ["-m", str(tiny_gguf)]
    assert argv[-4:] == ARGS and "--alias" in argv
    assert psutil.Process(record["pid"]).environ()["CUDA_VISIBLE_DEVICES"] == ""
    # Reported starting (while the server loaded), then ready.
    states = [e["type"] for e in history(c, "tiny") if e["type"].startswith("replica.")]
    assert states.index("replica.starting") < states.index("replica.ready")

    # What one request may really use, as llama.cpp's /props says, kept on the
    # replica and warned against the catalog's 1024.
    assert placement["effective_context_length"] == 512
    assert placement["context_detail"] == ARITHMETIC
    assert placement["context_warning"].startswith(f"{ARITHMETIC} < context_length 1024: ")
    shown = c.cli("placements", "--model", "tiny")
    assert shown.returncode == 0, shown.stderr
    assert f"warning: tiny[0]: {ARITHMETIC} < context_length 1024" in shown.stdout
    # And `llmgw status`, in its text and its --json.
    status = c.cli("status")
    assert status.returncode == 0, status.stderr
    said = [x for x in status.stdout.splitlines() if x.startswith("warning: tiny[0]: ")]
    assert said == [f"warning: tiny[0]: {placement['context_warning']}"], status.stdout
    status = c.cli("status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["context_warnings"] == [
        {
            "model": "tiny",
            "replica": 0,
            "profile": "cpu",
            "effective_context_length": 512,
            "context_detail": ARITHMETIC,
            "context_warning": placement["context_warning"],
        }
    ]

    # The OpenAI API with the official client, through the gateway. The weights are
    # random, so the text is nonsense; ignore_eos makes the engine produce exactly the
    # tokens asked for.
    _, gw, tokens = stack
    seen = eventually(lambda: gateway_sees(gw, 512), "the gateway routes to tiny/0", timeout=60)
    assert seen["endpoint"] == placement["endpoint"] and seen["context_detail"] == ARITHMETIC
    client = gw.openai(tokens.client)
    assert "tiny" in [m.id for m in client.models.list().data]
    ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Where do replicas run?"}]
    extra = {"ignore_eos": True}
    answer = client.chat.completions.create(
        model="tiny", messages=ask, max_tokens=6, temperature=0, extra_body=extra
    )
    assert answer.usage is not None and answer.usage.completion_tokens == 6
    assert answer.choices[0].message.content is not None
    chunks = client.chat.completions.create(
        model="tiny", messages=ask, max_tokens=6, temperature=0, stream=True, extra_body=extra
    )
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == answer.choices[0].message.content  # greedy: the same tokens
    completion = client.completions.create(
        model="tiny", prompt="The cluster", max_tokens=4, temperature=0, extra_body=extra
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 4

    # The gateway writes its log lines together, within 20 ms (llmgw.logs.BufferedLines).
    def served_lines() -> list[dict[str, Any]] | None:
        lines = [e for e in gw.logs("gateway.request") if e.get("status") == 200]
        return lines if len(lines) >= 3 else None

    served = eventually(served_lines, "three served requests logged", timeout=10)
    assert [(e["kind"], e["replica"], e["stream"]) for e in served] == [
        ("chat", "tiny/0", False),
        ("chat", "tiny/0", True),
        ("completions", "tiny/0", False),
    ]


def test_the_gateway_counts_the_slots_llama_cpp_says_on_props(stack: Stack) -> None:
    """The profile sets no ``slots``: the gateway asks the engine's ``/props`` and counts
    its ``total_slots`` (the engine's word wins over the args' ``--parallel``)."""
    c, gw, _ = stack
    placement = eventually(lambda: ready(c, "tiny"), "tiny[0] ready", timeout=180)
    props = httpx.get(placement["endpoint"] + "/props", timeout=30)
    assert props.status_code == 200, props.text
    total = props.json()["total_slots"]
    assert total == 4  # the profile's --parallel 4, as the engine runs it

    def counted() -> dict[str, Any] | None:
        found = gateway_sees(gw, 512)
        return found if found is not None and found["slots_source"] == "engine" else None

    seen = eventually(counted, "the gateway counts tiny/0's slots from /props", timeout=60)
    assert seen["slots"] == total
    # The gateway writes its log lines together, within 20 ms (llmgw.logs.BufferedLines).
    said = eventually(
        lambda: [e for e in gw.logs("gateway.engine_slots") if e["replica"] == "tiny/0"] or None,
        "the gateway logs what the engine said",
        timeout=10,
    )
    assert said[-1]["total_slots"] == total and said[-1]["source"] == "/props"
    assert not gw.logs("gateway.engine_slots_unknown")


def test_the_gateway_refuses_a_prompt_over_what_one_slot_gives_counted_by_the_engine(
    stack: Stack,
) -> None:
    """512 tokens a slot, under the catalog's 1024: a prompt between the two is refused
    400 by the gateway, counted by the engine's own /tokenize, and never sent to it."""
    c, gw, tokens = stack
    placement = eventually(lambda: ready(c, "tiny"), "tiny[0] ready", timeout=180)
    eventually(lambda: gateway_sees(gw, 512), "the gateway knows tiny/0's 512", timeout=60)

    def engine_count(text: str) -> int:
        said = httpx.post(placement["endpoint"] + "/tokenize", json={"content": text}, timeout=30)
        assert said.status_code == 200, said.text
        return len(said.json()["tokens"])

    client = gw.openai(tokens.client)
    long = "the replicas run on every node of the cluster " * 13
    n = engine_count(long)
    assert 512 < n + 4 <= 1024, n  # over one slot, within the catalog's promise
    before = len(gw.logs("gateway.request"))
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt=long, max_tokens=4)
    assert refused.value.status_code == 400
    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")
    assert error["message"] == (
        f"model 'tiny': the prompt is {n} tokens (by the engine's tokenizer) plus max_tokens 4, "
        f"above 512, what one request may use on replica tiny/0 ({ARITHMETIC} < "
        "context_length 1024: the smaller of the two is the limit); shorten the prompt or "
        "ask for fewer tokens"
    )
    # Refused by the gateway before any replica was tried: no attempt, no replica.
    logged = eventually(
        lambda: gw.logs("gateway.request")[before:] or None, "the refusal logged", timeout=10
    )
    assert [(e["status"], e["outcome"], e["replica"], e["attempts"]) for e in logged] == [
        (400, "refused", None, 0)
    ], logged
    assert logged[0]["prompt_tokens"] == n
    # Within one slot, the same path serves it.
    short = "the replicas run on every node " * 8
    assert engine_count(short) + 4 <= 512
    done = client.completions.create(
        model="tiny", prompt=short, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
    )
    assert done.usage is not None and done.usage.completion_tokens == 4


def test_an_engine_that_cannot_start_fails_with_its_own_error(llama: Cluster) -> None:
    def failed() -> str | None:
        for event in history(llama, "broken"):
            if event["type"] == "replica.failed":
                return str(event["reason"])
        return None

    message = eventually(failed, "broken[0] reported failed", timeout=120)
    # "replica 0 (cpu) on n1: the engine exited ...": llama.cpp's own words, not ours.
    assert ": the engine exited with code 1; last log lines: " in message
    assert "failed to load model" in message
    assert "exiting due to model loading error" in message


def test_engine_check_refuses_what_the_random_model_cannot_do(stack: Stack) -> None:
    c = stack[0]
    eventually(lambda: ready(c, "tiny"), "tiny[0] ready", timeout=180)
    done = c.cli("engine-check", "tiny")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines, done.stderr
    assert lines[0].startswith("engine-check tiny via replica tiny[0] at http://127.0.0.1:")
    tools = next(x for x in lines if x.strip().startswith("tools"))
    assert " refused " in tools
    context = next(x for x in lines if x.strip().startswith("context_length"))
    assert f"refused    {ARITHMETIC} < context_length 1024" in context
    checked = c.cli("engine-check", "tiny", "--json")
    assert checked.returncode == 1
    report = json.loads(checked.stdout)
    assert report["ok"] is False
    assert [(v["claim"], v["outcome"]) for v in report["verdicts"]] == [
        ("tools", "refused"),
        ("context_length", "refused"),
    ]
    # --gateway: through the real gateway with a client token; the context then comes
    # from what the replica's agent reported, as a gateway cannot reach the engine's /props.
    _, gw, tokens = stack
    token = c.workdir / "client.token"
    token.write_text("")
    empty = c.cli("engine-check", "tiny", "--gateway", gw.url, "--token-file", str(token))
    assert empty.returncode == 1 and "holds no token" in empty.stderr
    token.write_text(tokens.client + "\n")
    via = c.cli("engine-check", "tiny", "--gateway", gw.url, "--token-file", str(token), "--json")
    assert via.returncode == 1, via.stderr
    report = json.loads(via.stdout)
    assert report["via"] == f"gateway {gw.url}"
    verdicts = {v["claim"]: v for v in report["verdicts"]}
    assert verdicts["tools"]["outcome"] == "refused"
    assert verdicts["context_length"]["detail"].endswith(
        "(as the replica's agent reported it): a request may use 512 tokens"
    )
    # It went through the gateway: the tools probe is there, served by tiny/0.
    eventually(
        lambda: any(
            e["kind"] == "chat" and e["replica"] == "tiny/0" and e.get("client")
            for e in gw.logs("gateway.request")
        ),
        "the tools probe logged by the gateway",
        timeout=10,
    )
    # A token the gateway does not know is refused by it, not by the engine.
    token.write_text("llmgw_client_not_a_token\n")
    bad = c.cli("engine-check", "tiny", "--gateway", gw.url, "--token-file", str(token), "--json")
    assert bad.returncode != 0
    assert "401" in bad.stdout + bad.stderr, bad.stdout + bad.stderr


def test_health_answers_503_while_the_model_loads_and_the_agent_reads_it_as_not_ready(
    llama_server: str, tiny_gguf: Path, tmp_path: Path
) -> None:
    """llama-server listens before its model is loaded and answers /health 503 until
    then: what the agent reads as `starting`. Polled from the moment it is spawned."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(
        [llama_server, "-m", str(tiny_gguf), "--host", "127.0.0.1", "--port", str(port), *ARGS],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    seen: list[tuple[int | None, str]] = []
    url = f"http://127.0.0.1:{port}/health"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    seen.append((answer.status, answer.read().decode()))
                    break
            except urllib.error.HTTPError as exc:
                seen.append((exc.code, exc.read().decode()))
            except OSError:
                seen.append((None, "not listening"))
    finally:
        proc.terminate()
        proc.wait(30)
    codes = [code for code, _ in seen]
    assert codes[-1] == 200 and healthy(url) is False  # stopped now
    # Not listening, then loading (503, whose body says so), then ready: never back.
    loading = [(code, body) for code, body in seen if code is not None and code != 200]
    assert all(code == 503 and "Loading model" in body for code, body in loading), loading
    first_answer = next(i for i, code in enumerate(codes) if code is not None)
    assert all(code is not None for code in codes[first_answer:])


def test_draining_the_node_moves_the_replica_and_stops_its_engine_cleanly(
    llama: Cluster,
) -> None:
    c = llama
    eventually(lambda: ready(c, "tiny"), "tiny[0] ready", timeout=180)
    node, record = engine_of(c, "tiny")
    other = "n2" if node == "n1" else "n1"
    done = c.cli("nodes", "drain", node, "--reason", "test")
    assert done.returncode == 0, done.stderr

    def moved() -> dict[str, Any] | None:
        placed = ready(c, "tiny")
        return placed if placed is not None and placed["nodes"] == [other] else None

    eventually(moved, f"tiny[0] ready on {other}", timeout=180)
    agent = c.agents[node]
    eventually(
        lambda: [e for e in agent.logs("agent.engine_stopped") if e["model"] == "tiny"],
        f"the engine on {node} stopped",
        timeout=60,
    )
    assert not psutil.pid_exists(record["pid"]) or psutil.Process(record["pid"]).status() == (
        psutil.STATUS_ZOMBIE
    )
    # Stopped by SIGTERM within the grace period: llama-server's own goodbye is in its log.
    # The engine's log is the agent's to name (derived from its key, never from a record).
    (log_path,) = (agent.state_dir / "logs").glob(f"tiny-*-{record['replica']}.log")
    text = log_path.read_text(errors="replace")
    assert "cleaning up before exit" in text
    # Back in service for what follows.
    done = c.cli("nodes", "uncordon", node)
    assert done.returncode == 0, done.stderr


def test_a_killed_engine_is_reported_failed_with_its_last_log_lines_and_restarted(
    llama: Cluster,
) -> None:
    c = llama
    eventually(lambda: ready(c, "tiny"), "tiny[0] ready", timeout=180)
    _, record = engine_of(c, "tiny")
    os.killpg(record["pid"], signal.SIGKILL)

    def failed() -> str | None:
        for event in history(c, "tiny"):
            if event["type"] == "replica.failed":
                return str(event["reason"])
        return None

    message = eventually(failed, "tiny[0] reported failed", timeout=60)
    said = ": the engine was killed by SIGKILL; last log lines: "
    assert said in message
    assert " I srv " in message.split(said)[1] or " I slot " in message.split(said)[1]

    def restarted() -> dict[str, Any] | None:
        placed = ready(c, "tiny")
        if placed is None:
            return None
        _, now = engine_of(c, "tiny")
        return placed if now["pid"] != record["pid"] else None

    again = eventually(restarted, "tiny[0] ready again on a new engine", timeout=180)
    assert again["effective_context_length"] == 512
