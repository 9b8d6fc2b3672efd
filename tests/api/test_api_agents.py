"""Fifty agents reporting at once: every report answered, none lost, the last one stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api import load
from tests.api.server import ApiServer, Tokens, running

pytestmark = pytest.mark.slow

AGENTS = 50
REPORTS = 10


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_fifty_agents_reporting_concurrently_lose_nothing(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    db_url = str(request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url"))
    nodes = [f"node-{i:02d}" for i in range(AGENTS)]
    tokens = Tokens.issue(nodes)
    server = ApiServer(tmp_path, db_url, tokens=tokens)
    with running(server):
        stats = load.agents(server.url, tokens.agents, REPORTS)
        print(stats.line(f"{AGENTS} agents x {REPORTS} reports on {backend}"))
        assert stats.failures == ()
        assert stats.requests == AGENTS * REPORTS
        with server.client(tokens.reader) as reader:
            stored = {n["name"]: n for n in reader.get("/v1/nodes").json()}
        last = load.report_body(REPORTS - 1)
        assert sorted(stored) == nodes
        for name in nodes:
            assert stored[name]["labels"] == last["labels"], name
            assert stored[name]["gpus_reserved"] == last["gpus_reserved"], name
            assert stored[name]["state"] == "fresh"
        reports = [e for e in server.logs("api.request") if e["method"] == "PUT"]
        assert len(reports) == AGENTS * REPORTS
        assert {e["status"] for e in reports} == {200}
        assert {e["actor"] for e in reports} == {f"agent-{n}" for n in nodes}
        # Reports that arrived together were committed together: fewer transactions than
        # reports (each answered only after its own transaction committed).
        with server.client(tokens.reader) as reader:
            metrics = _counters(reader.get("/metrics").text)
        assert metrics["llmgw_node_reports_total"] == AGENTS * REPORTS
        assert 0 < metrics["llmgw_node_report_commits_total"] < AGENTS * REPORTS


def _counters(text: str) -> dict[str, float]:
    return {
        name: float(value)
        for name, _, value in (line.partition(" ") for line in text.splitlines())
        if not name.startswith("#") and "{" not in name
    }
