"""The node report's common case (``routes.report_fast_path``) answers exactly as the route.

A body sent with a ``Content-Length`` takes the lean path; the same body sent
chunked (no length) is declined by it and read by FastAPI's route. Every answer,
accepted or refused, must be the same either way, and so must the access log and
the metrics: an agent cannot tell which one answered it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.server import ApiServer, Tokens, running

pytestmark = pytest.mark.slow

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def api(module_db_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_db_url, tokens=tokens)) as server:
        yield server


BODIES: dict[str, str | bytes] = {
    "accepted": '{"gpu_class": "T4", "gpus": 4, "labels": {"zone": "a"}}',
    "accepted-with-name": '{"name": "node-0", "gpu_class": "T4", "gpus": 2}',
    "accepted-cpu-node": '{"gpu_class": "", "memory_gb": 32}',
    "invalid-field": '{"gpu_class": "T4", "gpus": 4, "gpus_reserved": 9}',
    "unknown-field": '{"gpu_class": "T4", "gpuz": 4}',
    "other-node": '{"name": "node-1", "gpu_class": "T4", "gpus": 4}',
    "not-a-mapping": "[1, 2, 3]",
    "duplicate-key": '{"gpus": 1, "gpus": 2}',
    "nul-in-label": '{"gpus": 1, "labels": {"zone": "a\\u0000b"}}',
    "lone-surrogate": '{"gpus": 1, "labels": {"zone": "\\ud800"}}',
    "too-deep": '{"gpus": 1, "labels": ' + "[" * 40 + "]" * 40 + "}",
    "yaml": "gpu_class: T4\ngpus: 4\n",
    "flow-yaml": "{gpu_class: T4, gpus: 4}",
    "empty": "",
    "not-utf8": b'{"gpu_class": "\xff"}',
    "huge-integer": '{"gpu_class": "T4", "gpus": 99999999999999999999}',
}


def _put(api: ApiServer, token: str, body: str | bytes, *, chunked: bool) -> httpx.Response:
    raw = body.encode() if isinstance(body, str) else body
    content: bytes | Iterator[bytes] = iter([raw]) if chunked else raw
    with api.client(token, headers=JSON) as agent:
        return agent.put("/v1/nodes/node-0", content=content)


def _comparable(response: httpx.Response) -> tuple[int, str, Any]:
    body = response.json()
    if response.status_code == 200:
        body.pop("reported_at")  # the clock moved between the two
        body.pop("report_id")  # each report has its own
    return response.status_code, response.headers["content-type"], body


@pytest.mark.parametrize("kind", list(BODIES))
def test_a_report_is_answered_the_same_by_the_lean_path_and_by_the_route(
    api: ApiServer, tokens: Tokens, kind: str
) -> None:
    lean = _put(api, tokens.agent, BODIES[kind], chunked=False)
    route = _put(api, tokens.agent, BODIES[kind], chunked=True)

    assert _comparable(lean) == _comparable(route), kind
    assert lean.headers.get("www-authenticate") == route.headers.get("www-authenticate")


@pytest.mark.parametrize(
    ("who", "path", "status"),
    [
        ("agent", "/v1/nodes/node-7", 403),  # not this token's node
        ("reader", "/v1/nodes/node-0", 403),
        ("nobody", "/v1/nodes/node-0", 401),
        ("wrong", "/v1/nodes/node-0", 401),
        ("agent", "/v1/nodes/node-0?force=1", 422),  # unknown query parameter
    ],
)
def test_a_report_the_lean_path_declines_is_refused_by_the_route_as_before(
    api: ApiServer, tokens: Tokens, who: str, path: str, status: int
) -> None:
    token = {"agent": tokens.agent, "reader": tokens.reader, "wrong": "llmgw_wrong"}.get(who)
    headers = {**JSON, **({"Authorization": f"Bearer {token}"} if token else {})}
    with httpx.Client(base_url=api.url, timeout=30) as client:
        response = client.put(path, content=BODIES["accepted"], headers=headers)

    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"


def test_reports_on_the_lean_path_are_logged_counted_and_stored_as_the_route_does(
    api: ApiServer, tokens: Tokens
) -> None:
    with api.client(tokens.operator) as ops:
        before = _series(ops.get("/metrics").text)
    body = {"gpu_class": "A100", "gpus": 8, "labels": {"rack": "r9"}}
    with api.client(tokens.agent) as agent:
        answer = agent.put("/v1/nodes/node-1", json=body)
    with api.client(tokens.operator) as ops:
        after = _series(ops.get("/metrics").text)
        listed = {n["name"]: n for n in ops.get("/v1/nodes").json()}

    assert answer.status_code == 200, answer.text
    # The answer is the node as listed, and what its heartbeats name (agent.heartbeat).
    heartbeats = {"report_id", "heartbeat_port", "placements_generation"}
    assert listed["node-1"] == {k: v for k, v in answer.json().items() if k not in heartbeats}
    put = 'llmgw_http_requests_total{method="PUT",route="/v1/nodes/{name}",status="200"}'
    assert after[put] == before.get(put, 0) + 1
    assert after["llmgw_node_reports_total"] == before["llmgw_node_reports_total"] + 1
    logged = [e for e in api.logs("api.request") if e["path"] == "/v1/nodes/node-1"]
    assert logged[-1]["status"] == 200
    assert logged[-1]["actor"] == "agent-a"


def _series(text: str) -> dict[str, float]:
    found = re.findall(r"^(llmgw_\S+) (\S+)$", text, re.MULTILINE)
    return {name: float(value) for name, value in found}


def test_many_reports_through_the_lean_path_each_get_their_own_node(
    api: ApiServer, tokens: Tokens
) -> None:
    """Reports of two nodes, interleaved, are answered each with its own node's state."""
    with api.client(tokens.agent) as agent:
        for k in range(20):
            node = f"node-{k % 2}"
            body = {"gpus": 1 + k % 5, "gpu_class": "T4"}
            answer = agent.put(f"/v1/nodes/{node}", json=body)
            assert answer.status_code == 200, answer.text
            assert (answer.json()["name"], answer.json()["gpus"]) == (node, 1 + k % 5)
        listed = {n["name"]: n["gpus"] for n in agent.get("/v1/nodes").json()}
    assert (listed["node-0"], listed["node-1"]) == (4, 5)  # k = 18 and 19, the last of each
