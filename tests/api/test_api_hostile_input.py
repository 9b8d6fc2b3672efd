"""Hostile bodies against a real server: refused quickly, never a 500, and never in the
way of other clients, /healthz or a SIGTERM.

No timing is asserted: a request that hung (as the alias bomb did, for minutes)
fails here by the client's timeout, and a server that ignored SIGTERM by
``stop()`` having to kill it.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.server import ApiServer, Tokens, running
from tests.hostile.documents import deep_definition, deep_json_array, model_bomb, node_bomb

YAML = {"Content-Type": "application/yaml"}
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def api(module_sqlite_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_sqlite_url, tokens=tokens)) as server:
        yield server


def test_the_alias_bomb_is_refused_on_the_node_route_with_an_agent_token(
    api: ApiServer, tokens: Tokens
) -> None:
    with api.client(tokens.agent, headers=YAML) as agent:
        response = agent.put("/v1/nodes/node-0", content=node_bomb())

    assert response.status_code == 422, response.text
    assert response.json()["type"] == "urn:llmgw:problem:invalid-node-report"
    assert "YAML anchors and aliases (&name, *name) are refused" in response.json()["detail"]


def test_the_alias_bomb_is_refused_on_the_catalog_route(api: ApiServer, tokens: Tokens) -> None:
    with api.client(tokens.operator, headers=YAML) as ops:
        response = ops.post("/v1/catalog/models", content=model_bomb())
        listed = ops.get("/v1/catalog").json()

    assert response.status_code == 422, response.text
    assert response.json()["type"] == "urn:llmgw:problem:invalid-definition"
    assert "request body: line 5: YAML anchors and aliases" in response.json()["detail"]
    assert [m["name"] for m in listed] == ["base-7b"], "nothing was recorded"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/catalog/models", deep_definition(3000)),
        ("POST", "/v1/catalog/models", deep_json_array(3000)),
        ("PUT", "/v1/nodes/node-0", '{"gpus": 1, "labels": ' + deep_json_array(3000) + "}"),
    ],
    ids=["definition-field", "bare-array", "node-report"],
)
def test_a_body_nested_3000_deep_is_a_422_naming_the_depth_limit(
    api: ApiServer, tokens: Tokens, method: str, path: str, body: str
) -> None:
    with api.client(tokens.operator if method == "POST" else tokens.agent, headers=JSON) as c:
        response = c.request(method, path, content=body)

    assert response.status_code == 422, response.text
    assert "nested deeper than 32 levels" in response.json()["detail"]


def test_a_body_over_the_size_limit_is_a_413_even_when_sent_without_a_length(
    api: ApiServer, tokens: Tokens
) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b" " * (64 << 10)

    with api.client(tokens.operator, headers=JSON) as ops:
        response = ops.post("/v1/catalog/models", content=chunks())

    assert response.status_code == 413, response.text


def _stalled_request(api: ApiServer, token: str) -> socket.socket:
    """A request whose body never finishes arriving: in flight until the socket closes."""
    host, port = api.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"PUT /v1/nodes/node-0 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {token}\r\nContent-Length: 500000\r\n\r\n".encode()
        + b'{"gpus": ['
    )
    return sock


def _bombard(api: ApiServer, tokens: Tokens, stop: threading.Event, statuses: list[int]) -> None:
    with api.client(tokens.operator, headers=YAML) as ops:
        while not stop.is_set():
            try:
                statuses.append(ops.post("/v1/catalog/models", content=model_bomb()).status_code)
            except httpx.TransportError:
                return  # the server stopped


def test_health_and_other_clients_are_answered_while_hostile_requests_are_in_flight(
    api: ApiServer, tokens: Tokens
) -> None:
    stop, statuses = threading.Event(), list[int]()
    stalled = [_stalled_request(api, tokens.agent) for _ in range(3)]
    bombers = [threading.Thread(target=_bombard, args=(api, tokens, stop, statuses))]
    for t in bombers:
        t.start()
    try:
        with api.client(tokens.reader, timeout=30) as reader:
            for _ in range(20):
                assert reader.get("/healthz").json() == {"status": "ok"}
                assert reader.get("/v1/models").status_code == 200
    finally:
        stop.set()
        for t in bombers:
            t.join(60)
        for sock in stalled:
            sock.close()
    assert statuses and set(statuses) == {422}


def test_sigterm_stops_the_server_with_hostile_requests_in_flight(
    tmp_path: Path, sqlite_url: str, tokens: Tokens
) -> None:
    server = ApiServer(tmp_path, sqlite_url, tokens=tokens)
    stop, statuses = threading.Event(), list[int]()
    with running(server):
        stalled = _stalled_request(server, tokens.agent)
        bomber = threading.Thread(target=_bombard, args=(server, tokens, stop, statuses))
        bomber.start()
        try:
            with server.client(tokens.reader) as reader:
                assert reader.get("/healthz").status_code == 200
            # stop() kills (and answers None) only if SIGTERM was not enough.
            assert server.stop() == 0
        finally:
            stop.set()
            bomber.join(60)
            stalled.close()
    assert server.logs("api.stopped")


def test_a_bombarded_server_still_records_a_real_report(api: ApiServer, tokens: Tokens) -> None:
    with api.client(tokens.agent) as agent:
        response = agent.put("/v1/nodes/node-1", json={"gpu_class": "T4", "gpus": 4})

    assert response.status_code == 200, response.text
    assert response.json()["name"] == "node-1"
