"""An agent refused for good ends: exit 1 with the server's message, not a retry forever."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.agents import AgentProc, cluster, eventually

pytestmark = pytest.mark.slow


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "llmgw.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


def test_an_agent_whose_token_may_not_report_its_node_exits_1_with_the_servers_message(
    tmp_path: Path, sqlite_url: str
) -> None:
    with cluster(tmp_path, sqlite_url, ["n1"]) as c:
        # n1's token, run as node n2: the server answers 403 to every report.
        wrong = AgentProc(tmp_path, c.server.url, "n2", c.tokens.agents["n1"], gpus="SIM:1")
        c.agents["n2"] = wrong
        wrong.start()
        assert wrong.proc is not None
        try:
            code = wrong.proc.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the agent kept retrying a refusal that cannot heal:\n{wrong.log_text()}")
        assert code == 1
        err = wrong.log_text()
        # The server's own words, and the fix.
        assert "may report node(s) n1, not 'n2'" in err
        assert "--role agent --node n2" in err
        (logged,) = wrong.logs("agent.refused_for_good")
        assert logged["node"] == "n2"
        # One refusal, then the end: not a line per tick.
        assert len(wrong.logs("agent.report_refused")) == 1
        # The server never recorded node n2.
        with c.server.client(c.tokens.reader) as http:
            assert "n2" not in {n["name"] for n in http.get("/v1/nodes").json()}

        # A right token still runs (the cluster is fine).
        right = c.agent("n1", gpus="SIM:1")
        eventually(lambda: right.logs("agent.reconciled"), "n1's agent reconciling")
