"""What a gateway reads of the tokens: the client tokens' hashes (for its OpenAI routes)
and the operator and reader tokens' hashes (for its /metrics and /routing), with a
gateway token only, against a real server."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.api.guards.tokens import digest, issue_token
from tests.api.server import ApiServer, Tokens, running

pytestmark = pytest.mark.slow


def test_a_gateway_reads_the_client_and_reader_tokens_hashes_and_no_one_else_does(
    tmp_path: Path, sqlite_url: str
) -> None:
    tokens = Tokens.issue(agent_nodes=["n1"])
    gw = issue_token("gw-1", "gateway")
    app = issue_token("app-1", "client", models=["base-7b"])
    env = {"LLMGW_TOKENS": ";".join([tokens.env, gw.entry.to_env(), app.entry.to_env()])}
    with running(ApiServer(tmp_path, sqlite_url, tokens=tokens, env=env)) as server:
        with server.client(gw.token) as gateway:
            clients = gateway.get("/v1/gateway/client-tokens")
            readers = gateway.get("/v1/gateway/reader-tokens")
        assert clients.status_code == 200 and readers.status_code == 200
        assert clients.json() == [
            {
                "name": "app-1",
                "sha256": digest(app.token),
                "models": ["base-7b"],
                "limits": {},
                "priority_class": "standard",
                "share": 1,
            }
        ]
        assert sorted(readers.json(), key=lambda e: e["name"]) == [
            {"name": "ops", "role": "operator", "sha256": digest(tokens.operator)},
            {"name": "viewer", "role": "reader", "sha256": digest(tokens.reader)},
        ]
        # Hashes are a gateway's to read (and an operator's, for tooling): a reader, an
        # agent or a client gets 403 naming the role; no token 401.
        for token in (tokens.reader, tokens.agents["n1"], app.token):
            with server.client(token) as other:
                for path in ("/v1/gateway/client-tokens", "/v1/gateway/reader-tokens"):
                    answer = other.get(path)
                    assert answer.status_code == 403, (path, answer.text)
        with server.client() as anonymous:
            assert anonymous.get("/v1/gateway/reader-tokens").status_code == 401
