"""An agent's moves to the next control-plane server, on the server's /metrics.

A real `llmgw agent` given two servers, the first a port nobody listens on (a killed
replica), the second a real `llmgw serve`: the agent moves on, and the live server shows
the count its report said, ``llmgw_agent_control_plane_switches_total{node}``. Before,
the agent only logged the move (it serves no /metrics), and an operator could not scrape it.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.e2e.agents import AgentProc, cluster, eventually

pytestmark = pytest.mark.slow


def _dead_url() -> str:
    with socket.socket() as s:  # a port that was free a moment ago: nobody listens
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_an_agent_that_left_a_dead_server_is_counted_on_the_live_servers_metrics(
    tmp_path: Path, sqlite_url: str
) -> None:
    dead = _dead_url()
    with cluster(tmp_path, sqlite_url, ["edge"], models=[]) as c:
        agent = AgentProc(
            tmp_path, dead, "edge", c.tokens.agents["edge"], "--server", c.server.url, gpus=None
        )
        c.agents["edge"] = agent  # stopped with the cluster
        agent.start()
        moved = eventually(lambda: agent.logs("agent.server_switched"), "the agent to move")
        assert (moved[0]["server"], moved[0]["to"]) == (dead, c.server.url)

        def counted() -> str | None:
            with c.server.client(c.tokens.reader) as client:
                text = client.get("/metrics").text
            line = 'llmgw_agent_control_plane_switches_total{node="edge"} 1.0'
            return text if line in text else None

        eventually(counted, "the live server to show the agent's switch")
        assert not agent.logs("agent.switches_unsupported")
