"""Agents' reports, the inventory and placements over HTTP, with the scheduler inside
``llmgw serve`` leading by the same rules as ``llmgw daemon``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests import forkserver
from tests.api.server import ApiServer, Tokens, definition, running
from tests.polling import poll_interval

pytestmark = pytest.mark.slow

T4 = {"gpu_class": "T4", "gpus": 4, "memory_gb": 64, "labels": {"zone": "a"}}


@pytest.fixture(scope="module")
def api(module_sqlite_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    server = ApiServer(
        module_dir, module_sqlite_url, tokens=tokens, args=["--with-scheduler", "--interval", "0.2"]
    )
    with running(server):
        yield server


def wait_for(check: Callable[[], bool], what: str, timeout: float = 120) -> None:
    # A bound that only catches a hang: rounds every 0.2 s, but a busy CI machine is slow.
    started = time.monotonic()
    while (waited := time.monotonic() - started) < timeout:
        if check():
            return
        time.sleep(poll_interval(waited))
    pytest.fail(f"timed out waiting for {what}")


def metric(client: httpx.Client, name: str) -> float:
    text = client.get("/metrics").text
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def cli(api: ApiServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LLMGW_DATABASE_URL": api.db_url, "LLMGW_CONFIG": api.env["LLMGW_CONFIG"]}
    return forkserver.run(args, cwd=api.workdir, env=env, timeout=60)


def test_a_report_is_recorded_with_the_path_name_and_listed_as_the_cli_lists_it(
    api: ApiServer, tokens: Tokens
) -> None:
    with api.client(tokens.agent) as agent:
        recorded = agent.put("/v1/nodes/node-0", json=T4)
        assert recorded.status_code == 200, recorded.text
        node = recorded.json()
        assert (node["name"], node["gpus"], node["state"], node["stale"]) == (
            "node-0",
            4,
            "fresh",
            False,
        )
        served = agent.get("/v1/nodes").json()
    printed = cli(api, "nodes", "list", "--json")
    assert printed.returncode == 0, printed.stderr
    listed = json.loads(printed.stdout)
    # The CLI says what it judged the node's state by: the policy this server recorded.
    judged = [row.pop("judged_by") for row in listed]
    assert served == listed
    assert {(j["source"], j["process"]) for j in judged} == {("started", "serve")}


def test_an_invalid_report_is_422_naming_the_node_the_field_and_the_fix(
    api: ApiServer, tokens: Tokens
) -> None:
    with api.client(tokens.agent) as agent:
        for body, expected in [
            ({**T4, "gpus": "4"}, "node \"node-1\": gpus '4' is not accepted"),
            ({**T4, "gpu_clas": "T4"}, "gpu_clas is not a field of a node report"),
            ({"gpus": 2}, "gpu_class is missing"),
            ({**T4, "gpus_reserved": 9}, "gpus_reserved 9 is more than gpus 4"),
            ([T4], "a node report is a mapping"),
            ({**T4, "gpus": 2**70}, "less than or equal to 1024"),
            ({**T4, "labels": {"zone": "a\u0000"}}, "NUL"),
        ]:
            response = agent.put("/v1/nodes/node-1", json=body)
            assert response.status_code == 422, (body, response.text)
            assert response.headers["content-type"] == "application/problem+json"
            assert response.json()["type"] == "urn:llmgw:problem:invalid-node-report"
            assert expected in response.json()["detail"], response.json()["detail"]
        assert "node-1" not in [n["name"] for n in agent.get("/v1/nodes").json()]


def test_a_reports_server_switches_show_on_metrics_per_node_and_a_count_out_of_bounds_is_422(
    api: ApiServer, tokens: Tokens
) -> None:
    name = 'llmgw_agent_control_plane_switches_total{node="node-0"}'
    with api.client(tokens.agent) as agent, api.client(tokens.reader) as reader:
        for bad, expected in [
            (-1, "greater than or equal to 0"),
            (2**31, "less than or equal to 2147483647"),
            ("3", "server_switches '3' is not accepted"),
        ]:
            response = agent.put("/v1/nodes/node-0", json={**T4, "server_switches": bad})
            assert response.status_code == 422, (bad, response.text)
            assert expected in response.json()["detail"], response.json()["detail"]
        assert name not in reader.get("/metrics").text
        # The last report's count is shown: an agent that restarted counts from 0 again.
        for count in (2**31 - 1, 2, 1):
            sent = agent.put("/v1/nodes/node-0", json={**T4, "server_switches": count})
            assert sent.status_code == 200, sent.text
            assert metric(reader, name) == count
        # A report without it (an older agent) leaves the last count.
        assert agent.put("/v1/nodes/node-0", json=T4).status_code == 200
        assert metric(reader, name) == 1


def test_the_scheduler_in_serve_places_and_an_agent_reads_what_to_run(
    api: ApiServer, tokens: Tokens
) -> None:
    with api.client(tokens.agent) as agent, api.client(tokens.operator) as ops:
        assert agent.put("/v1/nodes/node-0", json=T4).status_code == 200
        model = definition("placed-model", scaling={"min": 1}, fallbacks=["base"])
        assert ops.post("/v1/catalog/models", json=model).status_code == 201

        def placed() -> bool:
            return any(p["model"] == "placed-model" for p in agent.get("/v1/placements").json())

        wait_for(placed, "the scheduler in serve to place the new model")
        mine = agent.get("/v1/placements", params={"node": "node-0"}).json()
        (replica,) = [p for p in mine if p["model"] == "placed-model"]
        assert replica["nodes"] == ["node-0"] and replica["gpu_class"] == "T4"
        assert replica["engine"]["model_path"] == "org/placed-model"
        assert replica["engine"]["served_model_name"] == "placed-model"
        assert agent.get("/v1/placements", params={"node": "elsewhere"}).json() == []
        # A typo must not turn "what runs on my node" into "everything, everywhere".
        typo = agent.get("/v1/placements", params={"nodes": "node-0"})
        assert typo.status_code == 422
        assert "'nodes' (did you mean 'node'?)" in typo.json()["detail"]

        assert metric(agent, "llmgw_scheduler_leader") == 1
        assert metric(agent, "llmgw_placement_replicas_placed_total") >= 1
        assert metric(agent, "llmgw_placement_round_duration_seconds_count") >= 1
        assert metric(agent, "llmgw_node_reports_total") >= 1
        assert metric(agent, 'llmgw_catalog_events_appended_total{type="model.added"}') >= 1
    assert api.logs("placement.round"), "the same per-round log line as llmgw daemon"
    refused = cli(api, "place")
    assert refused.returncode == 1 and "a placement daemon is running" in refused.stderr


def test_a_second_server_with_a_scheduler_waits_and_takes_over_when_the_first_stops(
    api: ApiServer, tokens: Tokens, module_dir: Path
) -> None:
    second = ApiServer(
        module_dir,
        api.db_url,
        tokens=tokens,
        args=["--with-scheduler", "--interval", "0.2"],
    )
    with running(second), second.client(tokens.reader) as reader:
        wait_for(lambda: bool(second.logs("placement.waiting")), "the second to wait")
        assert metric(reader, "llmgw_scheduler_leader") == 0
        assert api.stop() == 0, "SIGTERM lets the round finish and exits 0"
        assert api.logs("placement.stopped")
        wait_for(lambda: metric(reader, "llmgw_scheduler_leader") == 1, "the second to lead")
