"""Secrets in profiles and endpoints agents claim, against a real `llmgw serve` (issue 25).

A profile's plain secret is refused at add and apply with the fix; a secret given by
reference is stored and served as its name; a value a release before this one stored
in plain text is read as [redacted] by every reader (placements, events, the event
stream, the catalog, the fleet, diffs), while the operator, and the agent of the
node that runs it, still get it. An agent's endpoint on another host than its node's
registered address is refused, logged once per report, and never handed out; a report
naming 1,024 replicas not placed on its node writes one log line. The foreign
endpoints here are only reported: nothing ever connects to them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from events.database.connection import make_engine
from scheduler.lifecycle.endpoints import NO_NETWORKS, endpoint_problem
from tests import forkserver
from tests.api.server import ApiServer, Tokens, running
from tests.support import insert_raw_event

pytestmark = pytest.mark.slow

VALUE = "hf_SUPERSECRETVALUE123"
# A key an older release let an operator give vLLM in args (issue 36).
ARG_VALUE = "sk-plaintext-123"
DECLARED = {
    "models": [
        {
            "name": "declared-7b",
            "source": "org/declared-7b",
            "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 1}],
        }
    ]
}
LEGACY = {
    "name": "legacy",
    "source": "org/legacy",
    "scaling": {"min": 1, "max": 1},
    "profiles": [
        {
            "name": "t4",
            "gpu_class": "T4",
            "tp": 1,
            "env": {"HF_TOKEN": VALUE, "LOG": "debug"},
            "args": ["--api-key", ARG_VALUE, "--max-model-len", "4096"],
        }
    ],
}


@pytest.fixture(scope="module")
def api(module_sqlite_url: str, module_dir: Path) -> Iterator[ApiServer]:
    # What an older release let an operator store: a token in plain text.
    engine = make_engine(module_sqlite_url)
    insert_raw_event(
        engine,
        1,
        payload={"model": LEGACY, "declared_digest": None},
        schema_version=2,
        model="legacy",
    )
    engine.dispose()
    tokens = Tokens.issue(["node-a"], gateways=["gw-a"])
    settings = module_dir / "llmgw.toml"
    settings.write_text('[server]\nagent_endpoint_networks = ["10.1.0.0/16"]\n')
    server = ApiServer(
        module_dir,
        module_sqlite_url,
        tokens=tokens,
        declared=DECLARED,
        env={"LLMGW_SETTINGS": str(settings)},
    )
    with running(server):
        yield server


def _tokens(api: ApiServer) -> Tokens:
    assert api.tokens is not None
    return api.tokens


def _definition(name: str, env: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "source": f"org/{name}",
        "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 1, "env": env}],
    }


def test_a_plain_secret_is_refused_at_add_and_apply_with_the_fix(api: ApiServer) -> None:
    ops = api.client(_tokens(api).operator)
    for name in ("HF_TOKEN", "openai_api_key", "DbPassword", "MY_SECRET"):
        answer = ops.post("/v1/catalog/models", json=_definition("plain", {name: VALUE}))
        assert answer.status_code == 422, answer.text
        assert f"env {name} holds its value in plain text" in answer.text
        assert "{secret: " in answer.text and "secrets_dir" in answer.text
        assert VALUE not in answer.text
    answer = ops.put("/v1/catalog/models/plain", json=_definition("plain", {"HF_TOKEN": VALUE}))
    assert answer.status_code == 422 and VALUE not in answer.text
    assert "plain" not in [m["name"] for m in ops.get("/v1/catalog").json()]


def test_a_key_in_args_is_refused_at_add_and_apply_naming_the_engines_variable(
    api: ApiServer,
) -> None:
    ops = api.client(_tokens(api).operator)
    for args, where in (
        (["--api-key", ARG_VALUE], "args[1] is the value of --api-key (args[0])"),
        ([f"--api-key={ARG_VALUE}"], "args[0] is --api-key, a flag that carries a secret"),
        (["--max-model-len", "4096", ARG_VALUE], "args[2] looks like a key or token"),
    ):
        definition = _definition("in-args", {})
        definition["profiles"][0]["args"] = args
        for answer in (
            ops.post("/v1/catalog/models", json=definition),
            ops.put("/v1/catalog/models/in-args", json=definition),
        ):
            assert answer.status_code == 422, answer.text
            problem = answer.json()
            assert f"model 'in-args' profile 't4': {where}" in problem["detail"]
            assert "`env: {VLLM_API_KEY: {secret: vllm-api-key}}`" in problem["detail"]
            assert ARG_VALUE not in answer.text
    assert "in-args" not in [m["name"] for m in ops.get("/v1/catalog").json()]


def test_args_choosing_where_the_engine_listens_are_refused(api: ApiServer) -> None:
    ops = api.client(_tokens(api).operator)
    for args in (["--host", "0.0.0.0"], ["--port=80"], ["--uds", "/tmp/e.sock"]):
        definition = _definition("bind", {})
        definition["profiles"][0]["args"] = args
        answer = ops.post("/v1/catalog/models", json=definition)
        assert answer.status_code == 422, answer.text
        assert "the agent's (`llmgw agent --engine-host`" in answer.json()["detail"]


def test_a_secret_by_reference_is_stored_and_served_as_its_name(api: ApiServer) -> None:
    ops = api.client(_tokens(api).operator)
    env = {"HF_TOKEN": {"secret": "hf-token"}, "LOG": "info"}
    assert ops.post("/v1/catalog/models", json=_definition("by-ref", env)).status_code == 201
    reader = api.client(_tokens(api).reader)
    (profile,) = reader.get("/v1/catalog/by-ref").json()["profiles"]
    assert profile["env"] == env
    # A reference that could escape the agent's secrets_dir is not a name.
    bad = _definition("escape", {"HF_TOKEN": {"secret": "../../etc/shadow"}})
    answer = ops.post("/v1/catalog/models", json=bad)
    assert answer.status_code == 422 and "secrets_dir" in answer.text


def _place(api: ApiServer) -> None:
    agent = api.client(_tokens(api).agents["node-a"])
    node = {"gpu_class": "T4", "gpus": 4, "address": "10.0.0.7"}
    assert agent.put("/v1/nodes/node-a", json=node).status_code == 200
    done = forkserver.run(["place"], cwd=api.workdir, env=api.env, timeout=300)
    assert done.returncode == 0, done.stderr


def _first_stream_message(client: httpx.Client) -> str:
    with client.stream("GET", "/v1/events/stream", params={"after": 0}) as answer:
        for line in answer.iter_lines():
            if line.startswith("data:"):
                return line
    raise AssertionError("the stream sent no event")


def test_a_reader_never_sees_a_secret_stored_in_plain_text(api: ApiServer) -> None:
    _place(api)
    tokens = _tokens(api)
    reader, ops = api.client(tokens.reader), api.client(tokens.operator)
    agent = api.client(tokens.agents["node-a"])
    head = reader.get("/v1/events").json()["head"]
    reads = [
        "/v1/placements",
        "/v1/placements?node=node-a",
        "/v1/events",
        "/v1/catalog",
        "/v1/catalog/legacy",
        "/v1/fleet",
        f"/v1/diff?a=0&b={head}",
    ]
    gateway = api.client(tokens.gateways["gw-a"])
    for path in reads:
        for who in (reader, agent, gateway):
            text = who.get(path).text
            if who is gateway and not path.startswith(("/v1/catalog", "/v1/placements")):
                continue  # a gateway token reads the catalog and the placements only
            if who is agent and path.endswith("node=node-a"):
                continue  # the agent of the node that runs it gets it (below)
            assert VALUE not in text, path
            assert ARG_VALUE not in text, path
    assert VALUE not in _first_stream_message(reader)
    assert ARG_VALUE not in _first_stream_message(reader)
    (placed,) = [p for p in reader.get("/v1/placements").json() if p["model"] == "legacy"]
    assert placed["engine"]["env"] == {"HF_TOKEN": "[redacted]", "LOG": "debug"}
    assert placed["engine"]["args"] == ["--api-key", "[redacted]", "--max-model-len", "4096"]
    # The operator sees what is stored; so does the agent of the node that runs it.
    for value in (VALUE, ARG_VALUE):
        assert value in ops.get("/v1/catalog/legacy").text
        assert value in _first_stream_message(ops)
        assert value in agent.get("/v1/placements", params={"node": "node-a"}).text
        # An agent reading another node's placements, or all of them, is a reader there.
        assert value not in agent.get("/v1/placements").text
        assert value not in agent.get("/v1/placements", params={"node": "node-b"}).text


def _report(api: ApiServer, endpoint: str, address: str = "10.0.0.7") -> dict[str, Any]:
    agent = api.client(_tokens(api).agents["node-a"])
    body = {
        "gpu_class": "T4",
        "gpus": 4,
        "address": address,
        "replicas": [{"model": "legacy", "replica": 0, "state": "ready", "endpoint": endpoint}],
    }
    assert agent.put("/v1/nodes/node-a", json=body).status_code == 200
    reader = api.client(_tokens(api).reader)
    (placed,) = [p for p in reader.get("/v1/placements").json() if p["model"] == "legacy"]
    return dict(placed)


def test_an_endpoint_on_another_host_is_refused_logged_and_never_handed_out(
    api: ApiServer,
) -> None:
    _place(api)
    metadata = "http://169.254.169.254/latest/meta-data/"
    before = len(api.logs("placement.endpoint_refused"))
    placed = _report(api, metadata)
    assert placed["state"] == "ready"
    assert placed["endpoint"] is None
    assert "refused" in placed["message"] and "10.0.0.7" in placed["message"]
    (line,) = api.logs("placement.endpoint_refused")[before:]
    assert line["node"] == "node-a" and line["refused"] == 1
    assert line["endpoints"] == [metadata]
    fleet = api.client(_tokens(api).reader).get("/v1/fleet").json()
    assert [p["endpoint"] for p in fleet["placements"] if p["model"] == "legacy"] == [None]
    # The node's own address, and a network the operator allows, are handed out.
    assert _report(api, "http://10.0.0.7:8000")["endpoint"] == "http://10.0.0.7:8000"
    assert _report(api, "http://10.1.2.3:8000")["endpoint"] == "http://10.1.2.3:8000"
    # The address registered first stays: advertising another moves nothing.
    moved = _report(api, metadata, address="169.254.169.254")
    assert moved["endpoint"] is None and "10.0.0.7" in moved["message"]
    assert _report(api, "http://10.0.0.7:8001")["endpoint"] == "http://10.0.0.7:8001"


def test_a_link_local_address_cannot_be_a_nodes_own(api: ApiServer) -> None:
    ops = api.client(_tokens(api).operator)
    body = {"gpu_class": "T4", "gpus": 1, "address": "169.254.169.254", "replicas": []}
    assert ops.put("/v1/nodes/node-meta", json=body).status_code == 200
    problem = endpoint_problem("http://169.254.169.254/", "169.254.169.254", NO_NETWORKS)
    assert problem is not None and "169.254.169.254" in problem


def test_a_report_of_1024_replicas_not_placed_here_writes_one_log_line(api: ApiServer) -> None:
    ops = api.client(_tokens(api).operator)
    replicas = [
        {"model": f"ghost-{i}", "replica": 0, "state": "ready", "endpoint": "http://10.9.9.9:1"}
        for i in range(1024)
    ]
    before = len(api.logs("placement.report_ignored"))
    body = {"gpu_class": "T4", "gpus": 1, "address": "10.9.9.9", "replicas": replicas}
    assert ops.put("/v1/nodes/node-flood", json=body).status_code == 200
    lines = [x for x in api.logs("placement.report_ignored")[before:] if x["node"] == "node-flood"]
    assert len(lines) == 1
    assert lines[0]["ignored"] == 1024
    assert len(lines[0]["replicas"]) == 3  # a few examples, not the whole list
    assert json.dumps(lines[0]).count("ghost-") == 3
