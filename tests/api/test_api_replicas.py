"""The replica-state contract over HTTP: agents report states, placements show and filter them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import forkserver
from tests.api.server import ApiServer, Tokens, running

pytestmark = pytest.mark.slow

DECLARED = {
    "models": [
        {
            "name": "base-7b",
            "aliases": ["base"],
            "source": "org/base-7b",
            "context_length": 4096,
            "scaling": {"min": 2},
            "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 1}],
        }
    ]
}


@pytest.fixture(scope="module")
def api(module_db_url: str, module_dir: Path) -> Iterator[ApiServer]:
    tokens = Tokens.issue(["node-a"])
    server = ApiServer(module_dir, module_db_url, tokens=tokens, declared=DECLARED)
    with running(server):
        yield server


def test_an_agent_reports_replica_states_and_placements_show_and_filter_them(
    api: ApiServer,
) -> None:
    tokens = api.tokens
    assert tokens is not None
    agent = api.client(tokens.agents["node-a"])
    reader = api.client(tokens.reader)
    node = {"gpu_class": "T4", "gpus": 4}
    assert agent.put("/v1/nodes/node-a", json=node).status_code == 200
    done = forkserver.run(["place"], cwd=api.workdir, env=api.env, timeout=300)
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


def test_what_one_request_may_use_is_kept_on_the_replica_and_a_larger_catalog_figure_warned(
    api: ApiServer,
) -> None:
    tokens = api.tokens
    assert tokens is not None
    agent = api.client(tokens.agents["node-a"])
    reader = api.client(tokens.reader)
    node = {"gpu_class": "T4", "gpus": 4}
    assert agent.put("/v1/nodes/node-a", json=node).status_code == 200
    done = forkserver.run(["place"], cwd=api.workdir, env=api.env, timeout=300)
    assert done.returncode == 0, done.stderr
    ready = {"model": "base-7b", "state": "ready", "endpoint": "http://10.0.0.7:8000"}
    sent = {
        **node,
        "replicas": [
            {
                **ready,
                "replica": 0,
                "effective_context_length": 2048,
                "context_detail": "--ctx-size 8192 / --parallel 4 = 2048",
            },
            {**ready, "replica": 1, "effective_context_length": 8192, "context_detail": "x"},
        ],
    }
    assert agent.put("/v1/nodes/node-a", json=sent).status_code == 200
    first, second = reader.get("/v1/placements", params={"model": "base-7b"}).json()
    assert (first["effective_context_length"], first["context_detail"]) == (
        2048,
        "--ctx-size 8192 / --parallel 4 = 2048",
    )
    assert first["context_warning"].startswith(
        "--ctx-size 8192 / --parallel 4 = 2048 < context_length 4096: "
    )
    assert "model 'base-7b', profile 't4'" in first["context_warning"]
    # Enough for the catalog's 4096: no warning.
    assert (second["effective_context_length"], second["context_warning"]) == (8192, None)

    for bad, field in (
        ({"effective_context_length": 0}, "effective_context_length"),
        ({"effective_context_length": "2048"}, "effective_context_length"),
        ({"context_detail": "\x1b[31mred"}, "context_detail"),
        ({"context_detail": "x" * 201}, "context_detail"),
    ):
        hostile = {**node, "replicas": [{**ready, "replica": 0, **bad}]}
        refused = agent.put("/v1/nodes/node-a", json=hostile)
        assert refused.status_code == 422, bad
        assert f"replicas.0.{field}" in refused.json()["detail"]
    # Nothing of the refused reports was kept.
    again = reader.get("/v1/placements", params={"model": "base-7b"}).json()
    assert again[0]["effective_context_length"] == 2048
