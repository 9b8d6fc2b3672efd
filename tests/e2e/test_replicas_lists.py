"""An agent and a gateway given two control-plane replicas leave a frozen one for the other.

Frozen (SIGSTOP), not killed: the kernel still accepts connections to it, so only a bound
on the answer moves a client on. Before, a comma-separated list failed every fetch, and a
client followed one URL only: the frozen replica's node went `lost` and its engines were
stopped and started anew when it came back.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.replicas import Replicas, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

CHAT = {
    "name": "chat",
    "source": "sim/chat",
    "scaling": {"min": 1},
    "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM"}],
}


@pytest.fixture
def pair(tmp_path: Path, pg_url: str) -> Iterator[Replicas]:
    cluster = Replicas(tmp_path, pg_url, {"models": [CHAT]}, count=2)
    try:
        for i in range(2):
            cluster.start_server(i)
        yield cluster
    finally:
        cluster.close()


def test_a_frozen_replica_is_left_for_the_next_by_the_agent_and_the_gateway(
    pair: Replicas,
) -> None:
    agent = pair.agent(0)  # the list starts at replica 0
    wait_until(lambda: [r for r in agent.live_engines() if r["ready"]], "chat ready on node-0")
    gateway = pair.gateway(0)
    wait_until(lambda: gateway.ready("chat", 1), "the gateway to route chat")
    # A ready engine's record is still filled in on the agent's next ticks (its context,
    # asked up to three times: agent.runtime): taken once that is done, so that the record
    # compared at the end differs only if the engine does. (A gateway started as a fresh
    # process used to give the agent that time; forked, it is ready at once.)
    (engine,) = wait_until(
        lambda: [
            r
            for r in agent.live_engines()
            if r["context_tokens"] is not None or r["context_asks"] >= 3
        ],
        "chat's context read by the agent",
    )
    first, second = pair.urls

    pair.signal(0, signal.SIGSTOP)
    try:
        moved = wait_until(lambda: agent.logs("agent.server_switched"), "the agent to move")
        assert (moved[0]["server"], moved[0]["to"]) == (first, second)
        said = wait_until(lambda: gateway.logs("gateway.server_switched"), "the gateway to move")
        assert (said[0]["server"], said[0]["to"]) == (first, second)
        wait_until(
            lambda: (
                f'llmgw_gateway_control_plane_switches_total{{server="{second}"}} 1.0'
                in gateway.get("/metrics").text
            ),
            "the gateway to count its move",
        )
        wait_until(lambda: gateway.get("/healthz").json()["status"] == "ok", "the gateway synced")
        # The node keeps reporting (through the other replica): it never goes stale.
        reports = len(agent.logs("agent.reconciled"))
        wait_until(lambda: len(agent.logs("agent.reconciled")) > reports + 5, "more ticks")
        answer = gateway.openai(pair.gw_tokens.client).chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert answer.choices
    finally:
        pair.signal(0, signal.SIGCONT)
    assert agent.live_engines() == [engine], "the engine was restarted"
