"""PUT /v1/catalog/models/{name} against a real server, on SQLite and PostgreSQL: add or replace
in one event, unchanged writes nothing, and refusals in the CLI's words and statuses."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests import forkserver
from tests.api.server import ApiServer, Tokens, definition, running
from tests.api.test_api_catalog import assert_problem

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api(module_db_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_db_url, tokens=tokens)) as server:
        yield server


@pytest.fixture(scope="module")
def ops(api: ApiServer, tokens: Tokens) -> Iterator[httpx.Client]:
    with api.client(tokens.operator) as client:
        yield client


def put(client: httpx.Client, name: str, body: Any, **kwargs: Any) -> httpx.Response:
    return client.put(f"/v1/catalog/models/{name}", json=body, **kwargs)


def cli_apply(api: ApiServer, body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = api.workdir / "apply.yaml"
    path.write_text(yaml.safe_dump(body))
    env = {**os.environ, "LLMGW_DATABASE_URL": api.db_url, "LLMGW_CONFIG": api.env["LLMGW_CONFIG"]}
    return forkserver.run(["apply", str(path)], cwd=api.workdir, env=env, timeout=60)


def test_put_adds_then_replaces_in_one_event_and_answers_the_diff(ops: httpx.Client) -> None:
    added = put(ops, "swap", definition("swap", aliases=["sw"]), params={"reason": "try"})
    assert added.status_code == 201, added.text
    body = added.json()
    assert (body["outcome"], body["model"], body["already_recorded"]) == ("added", "swap", False)
    assert body["diff"] == {"added": ["swap"], "removed": [], "changed": []}
    assert [e["type"] for e in body["events"]] == ["model.added"]

    replaced = put(ops, "swap", definition("swap", aliases=["sw"], scaling={"min": 1, "max": 3}))
    assert replaced.status_code == 200, replaced.text
    body = replaced.json()
    assert body["outcome"] == "replaced" and body["position"] == body["events"][0]["position"]
    assert [e["type"] for e in body["events"]] == ["model.replaced"]
    assert body["diff"]["changed"] == [
        {
            "model": "swap",
            "changes": [
                {"path": "scaling.min", "before": 0, "after": 1},
                {"path": "scaling.max", "before": 1, "after": 3},
            ],
        }
    ]
    assert body["events"][0]["payload"]["model"]["scaling"] == {"min": 1, "max": 3}
    assert ops.get("/v1/catalog/sw").json()["scaling"] == {"min": 1, "max": 3}

    same = put(ops, "swap", definition("swap", aliases=["sw"], scaling={"min": 1, "max": 3}))
    assert same.status_code == 200
    assert same.json() | {"diff": None} == {
        "outcome": "unchanged",
        "model": "swap",
        "position": None,
        "already_recorded": False,
        "diff": None,
        "events": [],
    }


def test_a_path_that_does_not_name_the_body_or_a_list_is_an_invalid_request(
    ops: httpx.Client,
) -> None:
    mismatch = assert_problem(put(ops, "one", definition("other")), 422, "invalid-definition")
    assert "'one'" in mismatch["detail"] and "'other'" in mismatch["detail"]
    listed = put(ops, "one", {"models": [definition("one"), definition("two")]})
    assert "one model definition" in assert_problem(listed, 422, "invalid-definition")["detail"]
    assert ops.get("/v1/catalog/one").status_code == 404


def test_refusals_answer_409_in_the_words_the_cli_prints(api: ApiServer, ops: httpx.Client) -> None:
    declared = definition("base-7b", aliases=["base"], source="laptop/base")
    refused = assert_problem(put(ops, "base-7b", declared), 409, "refused")
    assert "cannot be replaced at runtime" in refused["detail"]
    assert "catalog.yaml instead" in refused["detail"]
    by_cli = cli_apply(api, declared)
    assert by_cli.returncode == 1
    assert by_cli.stderr.strip() == f"error: {refused['detail']}"

    assert put(ops, "keep", definition("keep", aliases=["kp"])).status_code == 201
    assert put(ops, "leans", definition("leans", fallbacks=["kp"])).status_code == 201
    dropped = assert_problem(put(ops, "keep", definition("keep")), 409, "refused")
    assert "'leans' falls back to it" in dropped["detail"]
    assert dropped["model"] == "keep" and dropped["field"] == "aliases"


def test_a_key_answers_the_first_outcome_and_refuses_another_change(
    api: ApiServer, ops: httpx.Client, tokens: Tokens
) -> None:
    assert put(ops, "keyed", definition("keyed")).status_code == 201
    change = definition("keyed", scaling={"min": 1})
    first = put(ops, "keyed", change, headers={"Idempotency-Key": "apply-1"})
    again = put(ops, "keyed", change, headers={"Idempotency-Key": "apply-1"})
    assert first.status_code == again.status_code == 200
    assert again.json()["already_recorded"] is True
    assert again.json()["events"] == first.json()["events"]
    assert again.json()["diff"] == first.json()["diff"]
    other = put(ops, "keyed", definition("keyed"), headers={"Idempotency-Key": "apply-1"})
    assert_problem(other, 409, "key-reused")

    with api.client(tokens.reader) as reader:
        assert put(reader, "keyed", definition("keyed")).status_code == 403
