"""Operations over HTTP: the OpenAI SDK against /v1/models, /docs without a CDN, the
cluster's gauges on /metrics, /v1/fleet and /v1/diff, on a real `llmgw serve`."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests import forkserver
from tests.api.server import LLMGW, ApiServer, Tokens, definition, running

pytestmark = pytest.mark.slow

NODE = {"gpu_class": "T4", "gpus": 2, "memory_gb": 64}


@pytest.fixture(scope="module")
def api(module_db_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    server = ApiServer(module_dir, module_db_url, tokens=tokens)
    with running(server):
        with server.client(tokens.operator) as ops:
            added = ops.post("/v1/catalog/models", json=definition("runtime-1", aliases=["r1"]))
            assert added.status_code == 201, added.text
            big = definition(
                "too-big",
                profiles=[{"name": "t4", "gpu_class": "T4", "tp": 8}],
                scaling={"min": 1},
            )
            assert ops.post("/v1/catalog/models", json=big).status_code == 201
        with server.client(tokens.agent) as agent:
            assert agent.put("/v1/nodes/node-0", json=NODE).status_code == 200
        place(server)  # one scheduler round: /v1/fleet shows its reasons
        yield server


def place(server: ApiServer, *extra: str) -> dict[str, Any]:
    """One real scheduler round (``llmgw place``), as the daemon runs it."""
    done = forkserver.run(
        ["place", "--json", *extra],
        env={**server.env, "LLMGW_LOG_LEVEL": "ERROR"},
        cwd=server.workdir,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def sdk(api: ApiServer, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key=token, max_retries=0, timeout=30)


def test_the_openai_sdk_lists_and_retrieves_models(api: ApiServer, tokens: Tokens) -> None:
    client = sdk(api, tokens.reader)
    listed = {m.id: m for m in client.models.list()}
    assert {"base-7b", "runtime-1", "too-big"} <= set(listed)
    model = client.models.retrieve("r1")  # an alias answers with the canonical id
    assert model.id == "runtime-1" and model.object == "model"
    # created: when the model.added event was recorded; a declared model has none (0).
    assert model.created > 1_700_000_000
    assert listed["runtime-1"].created == model.created
    assert client.models.retrieve("base-7b").created == 0


def test_the_sdk_shows_the_servers_message_for_an_error(api: ApiServer, tokens: Tokens) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        sdk(api, tokens.reader).models.retrieve("no-such-model")
    assert "'no-such-model' is not in the catalog" in missing.value.message
    assert missing.value.code == "not-found"
    with pytest.raises(openai.AuthenticationError) as refused:
        sdk(api, "not-a-token").models.list()
    assert "not configured on this server" in refused.value.message


def test_errors_outside_v1_models_stay_problem_documents(api: ApiServer) -> None:
    answer = httpx.get(f"{api.url}/v1/catalog", timeout=30)
    assert answer.status_code == 401
    assert answer.headers["content-type"].startswith("application/problem+json")
    doc = httpx.get(f"{api.url}/openapi.json", timeout=30).json()
    retrieve = doc["paths"]["/v1/models/{model_id}"]["get"]
    assert retrieve["responses"]["404"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/OpenAIError"
    }


def test_docs_load_swagger_ui_from_this_server_not_a_cdn(api: ApiServer) -> None:
    page = httpx.get(f"{api.url}/docs", timeout=30).text
    urls = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert urls and all(u.startswith("/") for u in urls), urls
    for url in urls:
        assert httpx.get(f"{api.url}{url}", timeout=30).status_code == 200, url


def test_metrics_show_each_models_replicas_and_the_nodes_states(
    api: ApiServer, tokens: Tokens
) -> None:
    with api.client(tokens.reader) as http:
        text = http.get("/metrics").text
    assert 'llmgw_model_replicas_wanted{declared="false",model="too-big"} 1.0' in text
    assert 'llmgw_model_replicas_placed{declared="false",model="too-big"} 0.0' in text
    assert 'llmgw_model_replicas_unplaced{declared="false",model="too-big"} 1.0' in text
    assert 'llmgw_nodes{state="fresh"} 1.0' in text
    assert 'llmgw_node_gpus_used{node="node-0"} 0.0' in text
    assert "llmgw_placement_mass_loss_held_replicas 0.0" in text


def test_fleet_explains_each_unplaced_replica(api: ApiServer, tokens: Tokens) -> None:
    with api.client(tokens.reader) as http:
        fleet = http.get("/v1/fleet").json()
    models = {m["name"]: m for m in fleet["models"]}
    assert models["too-big"]["wanted"] == 1 and models["too-big"]["placed"] == 0
    (why,) = models["too-big"]["unplaced_reasons"]
    assert "fewer than 8 free GPUs" in why["reason"] or "0/1 nodes fit" in why["reason"]
    (node,) = fleet["nodes"]
    assert node["name"] == "node-0" and node["state"] == "fresh" and node["gpus_free"] == 2


def test_diff_between_two_positions_and_past_the_head(api: ApiServer, tokens: Tokens) -> None:
    with api.client(tokens.reader) as http:
        diff = http.get("/v1/diff", params={"a": 0, "b": 2}).json()
        assert diff["added"] == ["runtime-1", "too-big"]
        past = http.get("/v1/diff", params={"a": 0, "b": 99})
    # A position the log has not reached is a catalog that does not exist yet (issue 11,
    # item 10: the document calls it a valid request, so it is no longer a 422).
    assert past.status_code == 404, past.text
    assert "past the log's head (2)" in past.json()["detail"]
    assert "diff positions 0 to 2" in past.json()["detail"]


def test_a_token_appended_by_the_cli_works_until_revoked(tmp_path: Path, sqlite_url: str) -> None:
    auth = tmp_path / "auth.toml"
    env = {"LLMGW_DATABASE_URL": sqlite_url, "PATH": "/usr/bin:/bin"}
    made = subprocess.run(
        [LLMGW, "token", "new", "carol", "--role", "reader", "--append-to", str(auth)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    token = made.stdout.splitlines()[0]
    listed = subprocess.run(
        [LLMGW, "token", "list", "--auth-file", str(auth), "--json"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    assert '"name": "carol"' in listed.stdout and token not in listed.stdout
    server = ApiServer(tmp_path, sqlite_url, args=["--auth-file", str(auth)])
    with running(server):
        assert server.client(token).get("/v1/catalog").status_code == 200
    subprocess.run(
        [LLMGW, "token", "revoke", "carol", "--auth-file", str(auth)], check=True, env=env
    )
    with running(server):
        assert server.client(token).get("/v1/catalog").status_code == 401


def test_fleet_gives_the_last_round_s_reasons_cordons_included_and_the_placement_head(
    tmp_path: Path, db_url: str, tokens: Tokens
) -> None:
    """/v1/fleet planned a round on every request. It now reads what the scheduler's last
    round left unplaced and why (cordons, drains and back-offs included, as the daemon
    plans), and says which round that was; and it says where the placement log stands,
    for the dashboard's stream."""
    server = ApiServer(tmp_path, db_url, tokens=tokens, declared=None)
    with running(server), server.client(tokens.operator) as ops:
        model = definition("kept-off", scaling={"min": 1})
        assert ops.post("/v1/catalog/models", json=model).status_code == 201
        assert ops.put("/v1/nodes/node-0", json=NODE).status_code == 200
        cordoned = ops.post("/v1/nodes/node-0/cordon", params={"reason": "bad fan"})
        assert cordoned.status_code == 200, cordoned.text
        before = ops.get("/v1/fleet").json()
        daemon = place(server)
        fleet = ops.get("/v1/fleet").json()
        # The inputs change (uncordoned) but no round has run: the answer is still the
        # last round's, which a plan per request would not have given.
        assert ops.post("/v1/nodes/node-0/uncordon").status_code == 200
        still = ops.get("/v1/fleet").json()
        placed = place(server)
        after = ops.get("/v1/fleet").json()

    (row,) = before["models"]
    assert row["unplaced"] == 1 and row["unplaced_reasons"] == []
    assert before["reasons_from"] is None

    (row,) = fleet["models"]
    assert row["wanted"] == 1 and row["placed"] == 0 and row["unplaced"] == 1
    (why,) = row["unplaced_reasons"]
    assert "cordon" in why["reason"], why
    assert [(u["replica"], u["reason"]) for u in daemon["unplaced"]] == [
        (why["replica"], why["reason"])
    ]
    assert fleet["reasons_from"]["catalog_position"] == 1
    assert fleet["reasons_from"]["recorded_round"] == 0  # the round changed no placement
    assert still["models"][0]["unplaced_reasons"] == row["unplaced_reasons"]
    assert still["reasons_from"] == fleet["reasons_from"]

    assert placed["unplaced"] == []
    (row,) = after["models"]
    assert row["placed"] == 1 and row["unplaced"] == 0 and row["unplaced_reasons"] == []
    assert after["reasons_from"]["recorded_round"] == 1
    assert after["reasons_from"]["planned_at"] > fleet["reasons_from"]["planned_at"]

    done = forkserver.run(
        ["history", "--placements", "--json"],
        env={**server.env, "LLMGW_LOG_LEVEL": "ERROR"},
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    placement_log = [e for e in json.loads(done.stdout) if e["log"] == "placements"]
    assert [e["type"] for e in placement_log][:1] == ["node.cordoned"]
    assert fleet["placement_head"] == placement_log[0]["position"]
