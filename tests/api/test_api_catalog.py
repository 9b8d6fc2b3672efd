"""The catalog over HTTP against a real server, on SQLite and PostgreSQL: reads, the write path,
and every error status with the CLI's own messages."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from catalog import load_declared
from events.database.connection import make_engine
from events.read.replay import replay
from events.storage.backends import open_log
from tests import forkserver
from tests.api.server import ApiServer, Tokens, definition, running

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api(module_db_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_db_url, tokens=tokens)) as server:
        yield server
    # Everything the tests wrote went through the API: replaying it skips nothing.
    engine = make_engine(module_db_url)
    try:
        result = replay(load_declared(Path(server.env["LLMGW_CONFIG"])), open_log(engine).read())
    finally:
        engine.dispose()
    assert result.skipped == (), [s.to_json() for s in result.skipped]


@pytest.fixture(scope="module")
def ops(api: ApiServer, tokens: Tokens) -> Iterator[httpx.Client]:
    with api.client(tokens.operator) as client:
        yield client


def add(client: httpx.Client, body: Any, **kwargs: Any) -> httpx.Response:
    return client.post("/v1/catalog/models", json=body, **kwargs)


def assert_problem(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["type"] == f"urn:llmgw:problem:{kind}"
    assert body["status"] == status
    assert body["title"] and body["detail"]
    return body


def cli(api: ApiServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LLMGW_DATABASE_URL": api.db_url, "LLMGW_CONFIG": api.env["LLMGW_CONFIG"]}
    return forkserver.run(args, cwd=api.workdir, env=env, timeout=60)


def test_the_model_list_is_openai_compatible_and_carries_what_clients_size_prompts_by(
    ops: httpx.Client,
) -> None:
    listing = ops.get("/v1/models")
    assert listing.status_code == 200
    body = listing.json()
    assert body["object"] == "list"
    (base,) = [m for m in body["data"] if m["id"] == "base-7b"]
    assert base["object"] == "model"
    assert isinstance(base["owned_by"], str) and isinstance(base["created"], int)
    assert base["aliases"] == ["base"]
    assert (base["context_length"], base["max_output"]) == (32768, 4096)
    assert base["capabilities"] == {"tools": True, "vision": False, "embeddings": False}


def test_an_added_model_is_served_everywhere_with_the_token_name_as_its_actor(
    ops: httpx.Client,
) -> None:
    created = add(
        ops,
        definition("cat-added", aliases=["cat-a"], fallbacks=["base"]),
        params={"reason": "try before review"},
    )
    assert created.status_code == 201, created.text
    (event,) = created.json()["events"]
    assert (event["type"], event["model"], event["actor"], event["reason"]) == (
        "model.added",
        "cat-added",
        "ops",
        "try before review",
    )
    assert event["payload"]["model"]["profiles"][0]["startup_timeout"] == "20m"  # defaults
    assert "cat-added" in [m["id"] for m in ops.get("/v1/models").json()["data"]]
    by_alias = ops.get("/v1/catalog/cat-a")
    assert by_alias.status_code == 200
    assert by_alias.json()["name"] == "cat-added" and by_alias.json()["declared"] is False
    page = ops.get("/v1/events", params={"after": event["position"] - 1, "limit": 1}).json()
    assert page["events"] == [event]


def test_the_catalog_is_what_llmgw_models_json_prints(api: ApiServer, ops: httpx.Client) -> None:
    assert add(ops, definition("cat-json", context_length=8192)).status_code == 201
    served = ops.get("/v1/catalog")
    assert served.status_code == 200
    printed = cli(api, "models", "--json")
    assert printed.returncode == 0, printed.stderr
    assert served.json() == json.loads(printed.stdout)
    assert int(served.headers["x-llmgw-position"]) >= 1


def test_the_catalog_shows_each_model_s_resilience_under_the_placements_now(
    api: ApiServer, ops: httpx.Client, tokens: Tokens
) -> None:
    """Two replicas of one model on two nodes: losing one node leaves it a replica, so it
    is lost with 2 nodes; the same figure in `llmgw models --json` and the API."""
    two = definition("cat-resilient", scaling={"min": 2, "max": 2})
    assert add(ops, two).status_code == 201
    with api.client(tokens.agent) as agent:  # the agent token reports node-0 and node-1
        for node in ("node-0", "node-1"):
            report = {"gpu_class": "T4", "gpus": 1}
            assert agent.put(f"/v1/nodes/{node}", json=report).status_code == 200
    placed = cli(api, "place")
    assert placed.returncode == 0, placed.stderr
    entry = ops.get("/v1/catalog/cat-resilient").json()
    assert entry["replicas"]["placed"] == 2
    assert entry["resilience"] == {"replicas": 2, "nodes": 2, "spread_by": None, "domains": None}
    listed = {m["name"]: m for m in ops.get("/v1/catalog").json()}
    printed = {m["name"]: m for m in json.loads(cli(api, "models", "--json").stdout)}
    assert listed["cat-resilient"]["resilience"] == entry["resilience"]
    assert printed["cat-resilient"]["resilience"] == entry["resilience"]
    # /v1/fleet (the dashboard's read) gives the same figure.
    fleet = {m["name"]: m for m in ops.get("/v1/fleet").json()["models"]}
    assert fleet["cat-resilient"]["resilience"] == entry["resilience"]


def test_a_list_is_added_whole_in_dependency_order_or_not_at_all(ops: httpx.Client) -> None:
    pair = {"models": [definition("cat-top", fallbacks=["cat-low"]), definition("cat-low")]}
    created = add(ops, pair)
    assert created.status_code == 201, created.text
    assert [e["model"] for e in created.json()["events"]] == ["cat-low", "cat-top"]

    half = {"models": [definition("cat-half"), definition("cat-dangling", fallbacks=["nowhere"])]}
    body = assert_problem(add(ops, half), 409, "refused")
    assert "fallback 'nowhere' is not in the catalog" in body["detail"]
    assert body["model"] == "cat-dangling" and body["field"] == "fallbacks"
    assert ops.get("/v1/catalog/cat-half").status_code == 404


def test_an_idempotency_key_records_once_and_refuses_a_different_change(
    ops: httpx.Client,
) -> None:
    first = add(ops, definition("cat-keyed"), headers={"Idempotency-Key": "cat-key-1"})
    again = add(ops, definition("cat-keyed"), headers={"Idempotency-Key": "cat-key-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["already_recorded"] is True
    assert again.json()["events"] == first.json()["events"]
    other = add(ops, definition("cat-other"), headers={"Idempotency-Key": "cat-key-1"})
    body = assert_problem(other, 409, "key-reused")
    assert "already used for a different change" in body["detail"]
    bad_key = add(ops, definition("cat-k2"), headers={"Idempotency-Key": "x" * 129})
    assert_problem(bad_key, 422, "invalid-request")


def test_an_idempotency_key_with_the_same_name_but_another_definition_is_refused(
    ops: httpx.Client,
) -> None:
    key = {"Idempotency-Key": "cat-key-source"}
    first = add(ops, definition("cat-sourced"), headers=key)
    assert first.status_code == 201, first.text
    moved = add(ops, definition("cat-sourced", source="org/elsewhere"), headers=key)
    body = assert_problem(moved, 409, "key-reused")
    assert "not the one recorded then" in body["detail"]
    assert ops.get("/v1/catalog/cat-sourced").json()["source"] == "org/cat-sourced"
    spelled_out = [{"name": "t4", "gpu_class": "T4", "tp": 1, "engine": "vllm"}]
    same = add(ops, definition("cat-sourced", profiles=spelled_out), headers=key)
    assert same.status_code == 200, "the same definition, its default spelled out"
    assert same.json()["events"] == first.json()["events"]


def test_an_invalid_definition_is_422_with_the_message_the_cli_prints(
    api: ApiServer, ops: httpx.Client
) -> None:
    typo = definition("cat-typo")
    typo["profiles"][0]["gpu_clas"] = "T4"
    body = assert_problem(add(ops, typo), 422, "invalid-definition")
    assert "did you mean 'gpu_class'?" in body["detail"]
    (api.workdir / "typo.json").write_text(json.dumps(typo))
    printed = cli(api, "add", "typo.json")
    assert printed.returncode == 1
    assert printed.stderr.strip() == "error: " + body["detail"].replace("request body", "typo.json")

    for raw, expected in [
        (b"{not json", "not valid YAML or JSON"),
        (b"", "empty"),
        (b'{"models": []}', "holds no model definitions"),
        (b'{"name": "a", "name": "b"}', "written twice"),
        (
            b'{"name": "cat-nan", "source": "x", "profiles": [], "context_length": NaN}',
            "no such number",
        ),
        (json.dumps(definition("cat-\u0000nul")).encode(), "NUL"),
        (b'"just a string"', "expected a mapping"),
        (yaml.safe_dump({"models": [{"name": "cat-y", "source": "s"}]}).encode(), "profile"),
    ]:
        response = ops.post("/v1/catalog/models", content=raw)
        assert expected in assert_problem(response, 422, "invalid-definition")["detail"], raw
    yaml_body = yaml.safe_dump(definition("cat-yaml")).encode()
    assert ops.post("/v1/catalog/models", content=yaml_body).status_code == 201


def test_what_the_catalog_refuses_is_409_and_names_what_to_do(ops: httpx.Client) -> None:
    clash = assert_problem(add(ops, definition("base")), 409, "refused")
    assert "configuration wins every conflict" in clash["detail"]
    assert "catalog.yaml" in clash["detail"]
    assert_problem(add(ops, definition("cat-b", aliases=["base-7b"])), 409, "refused")

    declared = assert_problem(ops.delete("/v1/catalog/models/base-7b"), 409, "refused")
    assert "cannot be removed at runtime" in declared["detail"]
    assert "catalog.yaml" in declared["detail"]

    assert add(ops, definition("cat-target", aliases=["cat-t"])).status_code == 201
    assert add(ops, definition("cat-dependent", fallbacks=["cat-t"])).status_code == 201
    dependents = assert_problem(ops.delete("/v1/catalog/models/cat-target"), 409, "refused")
    assert "'cat-dependent' falls back to it" in dependents["detail"]
    by_alias = assert_problem(ops.delete("/v1/catalog/models/cat-t"), 409, "refused")
    assert "remove the model by its name" in by_alias["detail"]
    again = assert_problem(add(ops, definition("cat-target")), 409, "refused")
    assert "already in the catalog" in again["detail"]


def test_a_removal_is_recorded_and_what_is_unknown_is_404(ops: httpx.Client) -> None:
    assert add(ops, definition("cat-gone")).status_code == 201
    removed = ops.delete("/v1/catalog/models/cat-gone", params={"reason": "trial over"})
    assert removed.status_code == 200, removed.text
    (event,) = removed.json()["events"]
    assert (event["type"], event["model"], event["actor"]) == ("model.removed", "cat-gone", "ops")
    assert "cat-gone" not in [m["id"] for m in ops.get("/v1/models").json()["data"]]

    gone = assert_problem(ops.delete("/v1/catalog/models/cat-gone"), 404, "not-found")
    assert gone["detail"] == "model 'cat-gone' is not in the catalog; nothing to remove"
    unknown = assert_problem(ops.get("/v1/catalog/cat-gone"), 404, "not-found")
    assert "neither a name nor an alias" in unknown["detail"]
    assert_problem(ops.get("/v1/no-such-route"), 404, "not-found")
    assert_problem(ops.put("/v1/catalog"), 405, "method-not-allowed")


def test_events_page_by_position_up_to_the_head(ops: httpx.Client) -> None:
    for i in range(3):
        assert add(ops, definition(f"cat-page-{i}")).status_code == 201
    head = ops.get("/v1/events", params={"after": 0, "limit": 1}).json()["head"]
    seen: list[int] = []
    after = 0
    while True:
        page = ops.get("/v1/events", params={"after": after, "limit": 2}).json()
        seen.extend(e["position"] for e in page["events"])
        if page["next_after"] >= page["head"]:
            break
        after = page["next_after"]
    assert seen == list(range(1, len(seen) + 1)) and len(seen) >= head
    beyond = ops.get("/v1/events", params={"after": 10**9}).json()
    assert beyond["events"] == [] and beyond["next_after"] == 10**9
    assert_problem(ops.get("/v1/events", params={"limit": 0}), 422, "invalid-request")
    assert_problem(ops.get("/v1/events", params={"after": "x"}), 422, "invalid-request")


def test_a_body_over_the_limit_is_413(ops: httpx.Client) -> None:
    huge = definition("cat-huge", routing_profile="x" * (2 << 20))
    assert_problem(add(ops, huge), 413, "too-large")
