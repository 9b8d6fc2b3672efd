"""Who may do what, against a real server: 401 without or with a wrong token, 403 for a role
that does not allow the call, agents limited to their own nodes, and reads open by setting."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import forkserver
from tests.api.server import ApiServer, Tokens, definition, running

pytestmark = pytest.mark.slow

NODE = {"gpu_class": "T4", "gpus": 4, "memory_gb": 64}

READS: list[tuple[str, str]] = [
    ("GET", "/v1/models"),
    ("GET", "/v1/models/base"),
    ("GET", "/v1/catalog"),
    ("GET", "/v1/catalog/base"),
    ("GET", "/v1/catalog/models/base"),
    ("GET", "/v1/events"),
    ("GET", "/v1/events/stream"),
    ("GET", "/v1/nodes"),
    ("GET", "/v1/placements"),
    ("GET", "/v1/fleet"),
    ("GET", "/v1/diff?a=0&b=0"),
    ("GET", "/metrics"),
]
WRITES: list[tuple[str, str, object]] = [
    ("POST", "/v1/catalog/models", definition("auth-model")),
    ("DELETE", "/v1/catalog/models/auth-model", None),
    ("PUT", "/v1/nodes/node-0", NODE),
]


@pytest.fixture(scope="module")
def api(module_sqlite_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_sqlite_url, tokens=tokens)) as server:
        yield server


def call(client: httpx.Client, method: str, path: str, body: object = None) -> httpx.Response:
    if path.endswith("/stream"):
        with client.stream(method, path) as response:
            response.read() if response.status_code != 200 else None
            return response
    return client.request(method, path, json=body)


def test_without_a_token_every_read_and_write_is_401(api: ApiServer) -> None:
    with api.client() as anonymous:
        for method, path, body in [*((m, p, None) for m, p in READS), *WRITES]:
            response = call(anonymous, method, path, body)
            assert response.status_code == 401, (method, path, response.text)
            assert response.headers["www-authenticate"].startswith("Bearer")
            if path.startswith("/v1/models"):  # OpenAI's shape there (llmgw.api.rendering.openai)
                assert response.json()["error"]["code"] == "unauthenticated"
                continue
            assert response.headers["content-type"] == "application/problem+json"
            assert response.json()["type"] == "urn:llmgw:problem:unauthenticated"
        for open_path in ("/healthz", "/readyz", "/openapi.json"):
            assert anonymous.get(open_path).status_code == 200


def test_a_wrong_or_malformed_token_is_401(api: ApiServer, tokens: Tokens) -> None:
    with api.client(tokens.operator + "x") as wrong:
        for method, path, body in [*((m, p, None) for m, p in READS), *WRITES]:
            response = call(wrong, method, path, body)
            assert response.status_code == 401, (method, path)
            assert 'error="invalid_token"' in response.headers["www-authenticate"]
    with api.client(headers={"Authorization": f"Basic {tokens.operator}"}) as basic:
        assert basic.get("/v1/models").status_code == 401


def test_a_reader_reads_and_cannot_write(api: ApiServer, tokens: Tokens) -> None:
    with api.client(tokens.reader) as reader:
        for method, path in READS:
            assert call(reader, method, path).status_code == 200, path
        for method, path, body in WRITES:
            response = call(reader, method, path, body)
            assert response.status_code == 403, (method, path, response.text)
            assert response.json()["type"] == "urn:llmgw:problem:forbidden"
            assert "'viewer' has the reader role" in response.json()["detail"]


def test_an_agent_reports_only_its_own_nodes_and_cannot_change_the_catalog(
    api: ApiServer, tokens: Tokens
) -> None:
    with api.client(tokens.agent) as agent:
        assert agent.put("/v1/nodes/node-0", json=NODE).status_code == 200
        named = agent.put("/v1/nodes/node-1", json={**NODE, "name": "node-1"})
        assert named.status_code == 200 and named.json()["name"] == "node-1"
        other = agent.put("/v1/nodes/node-9", json=NODE)
        assert other.status_code == 403
        assert "may report node(s) node-0, node-1, not 'node-9'" in other.json()["detail"]
        # Its own path, another node in the body: refused, and nothing is recorded for either.
        smuggled = agent.put("/v1/nodes/node-0", json={**NODE, "name": "node-9"})
        assert smuggled.status_code == 422
        assert "must match" in smuggled.json()["detail"]
        assert "node-9" not in [n["name"] for n in agent.get("/v1/nodes").json()]
        for method, path, body in WRITES[:2]:
            response = call(agent, method, path, body)
            assert response.status_code == 403, (method, path)
            assert "needs an operator token" in response.json()["detail"]
        for method, path in READS:
            assert call(agent, method, path).status_code == 200, path


def test_an_operator_changes_the_catalog_and_may_report_any_node(
    api: ApiServer, tokens: Tokens
) -> None:
    with api.client(tokens.operator) as ops:
        assert ops.put("/v1/nodes/node-7", json=NODE).status_code == 200
        created = ops.post("/v1/catalog/models", json=definition("auth-ops"))
        assert created.status_code == 201
        assert created.json()["events"][0]["actor"] == "ops"
        assert ops.delete("/v1/catalog/models/auth-ops").status_code == 200
    requests = [e for e in api.logs("api.request") if e["path"] == "/v1/catalog/models"]
    assert {"method", "path", "status", "duration_ms", "actor"} <= set(requests[-1])
    assert requests[-1]["actor"] == "ops" and requests[-1]["status"] == 201


def test_tokens_from_llmgw_token_new_in_an_auth_file_with_open_reads(
    tmp_path: Path, module_sqlite_url: str
) -> None:
    auth = tmp_path / "auth.toml"
    auth.write_text("reads_open = true\n")
    # The file alone (--append-to, deprecated since tokens live in the database): still works.
    # Forked (tests/forkserver.py), as the suite's other commands are: the same command
    # without ~0.5 s of imports (a fresh process with LLMGW_TEST_FORK=0).
    issued = forkserver.run(
        ["token", "new", "alice", "--role", "operator", "--append-to", str(auth)],
        cwd=os.getcwd(),
        env=os.environ,
        timeout=60,
    )
    assert issued.returncode == 0, issued.stderr
    token = issued.stdout.splitlines()[0]
    assert token.startswith("llmgw_") and token not in auth.read_text()
    assert "--append-to is deprecated" in issued.stderr
    server = ApiServer(tmp_path, module_sqlite_url, args=["--auth-file", str(auth)])
    with running(server), server.client() as anonymous, server.client(token) as alice:
        assert anonymous.get("/v1/models").status_code == 200
        assert anonymous.get("/metrics").status_code == 200
        with server.client("llmgw_wrong") as wrong:
            assert wrong.get("/v1/models").status_code == 401
        assert anonymous.post("/v1/catalog/models", json=definition("auth-file")).status_code == 401
        created = alice.post("/v1/catalog/models", json=definition("auth-file"))
        assert created.status_code == 201
        assert created.json()["events"][0]["actor"] == "alice"


def test_serve_refuses_to_start_with_an_unusable_auth_file(tmp_path: Path) -> None:
    auth = tmp_path / "auth.toml"
    auth.write_text('[[tokens]]\nname = "root"\nrole = "admin"\nsha256 = "' + "0" * 64 + '"\n')
    done = forkserver.run(
        ["serve", "--port", "0", "--auth-file", str(auth)], cwd=tmp_path, env=os.environ, timeout=60
    )
    assert done.returncode == 1
    assert "tokens[0]: token 'root' has role 'admin'" in done.stderr
