"""The replica-state contract over HTTP: agents report states, placements show and filter them."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.server import LLMGW, ApiServer, Tokens, running

pytestmark = pytest.mark.slow

DECLARED = {
    "models": [
        {
            "name": "base-7b",
            "aliases": ["base"],
            "source": "org/base-7b",
            "scaling": {"min": 2},
            "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 1}],
        }
    ]
}


@pytest.fixture(scope="module")
def api(module_db_url: str, module_dir: Path) -> Iterator[ApiServer]:
    tokens = Tokens.issue(["node-a"])
    server = ApiServer(module_dir, module_db_url, tokens=tokens, declared=DECLARED)
    server.tokens = tokens  # type: ignore[attr-defined]
    with running(server):
        yield server


def test_an_agent_reports_replica_states_and_placements_show_and_filter_them(
    api: ApiServer,
) -> None:
    tokens: Tokens = api.tokens  # type: ignore[attr-defined]
    agent = api.client(tokens.agents["node-a"])
    reader = api.client(tokens.reader)
    node = {"gpu_class": "T4", "gpus": 4}
    assert agent.put("/v1/nodes/node-a", json=node).status_code == 200
    done = subprocess.run(
        [LLMGW, "place"], cwd=api.workdir, env=api.env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    listed = reader.get("/v1/placements", params={"node": "node-a"}).json()
    assert [(p["replica"], p["state"]) for p in listed] == [(0, "unreported"), (1, "unreported")]

    sent = {
        **node,
        "address": "10.0.0.7",  # registered: the host its endpoints may name (never dialled)
        "replicas": [
            {
                "model": "base-7b",
                "replica": 0,
                "state": "ready",
                "endpoint": "http://10.0.0.7:8000",
            },
            {"model": "base-7b", "replica": 1, "state": "starting", "message": "loading weights"},
        ],
    }
    assert agent.put("/v1/nodes/node-a", json=sent).status_code == 200
    listed = reader.get("/v1/placements", params={"model": "base"}).json()  # an alias
    assert [(p["replica"], p["state"], p["endpoint"]) for p in listed] == [
        (0, "ready", "http://10.0.0.7:8000"),
        (1, "starting", None),
    ]
    assert all(p["state_since"].endswith("Z") for p in listed)
    assert reader.get("/v1/placements", params={"node": "node-b"}).json() == []

    bad = {**node, "replicas": [{"model": "base-7b", "replica": 0, "state": "running"}]}
    refused = agent.put("/v1/nodes/node-a", json=bad)
    assert refused.status_code == 422
    assert "replicas.0.state 'running' is not accepted" in refused.json()["detail"]
