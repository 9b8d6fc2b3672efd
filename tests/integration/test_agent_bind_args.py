"""Where an engine listens is the agent's, even for a placement whose args say otherwise
(issue 36): a real agent starts a real sim engine from args stored before the catalog
refused ``--host`` (an old event still replays as it was), and the engine listens on
the agent's ``--engine-host`` only, with the dropped args logged."""

from __future__ import annotations

from pathlib import Path

import psutil
import structlog

from agent.inventory import Inventory
from agent.runtime import Agent, AgentConfig
from tests.integration.test_agent_runtime import StandIn, placement, tick_until


def test_an_engine_listens_where_the_agent_says_whatever_its_args_say(tmp_path: Path) -> None:
    server = StandIn([placement("chat", ["--host", "0.0.0.0", "--slots", "2"])])
    config = AgentConfig(
        node="n1", state_dir=tmp_path / "state", engine_host="127.0.0.1", stop_grace=5
    )
    inventory = Inventory(gpu_class="SIM", devices=(0, 1), memory_gb=64.0, cpus=2)
    # StandIn plays the ControlPlane client, a class (not a Protocol) it does not subclass.
    agent = Agent(config, inventory, server)  # type: ignore[arg-type]
    try:
        with structlog.testing.capture_logs() as logs:
            ready = tick_until(agent, server, "ready")
        (engine,) = agent.procs.values()
        process = psutil.Process(engine.pid)
        listening = {
            c.laddr.ip for c in process.net_connections("inet") if c.status == psutil.CONN_LISTEN
        }
        assert listening == {"127.0.0.1"}, listening
        assert "0.0.0.0" not in process.cmdline()
        assert process.cmdline()[-2:] == ["--slots", "2"]  # the other args still pass
        assert ready["endpoint"].startswith("http://127.0.0.1:")
    finally:
        agent.shutdown()
    (dropped,) = [e for e in logs if e["event"] == "agent.engine_args_dropped"]
    assert dropped["dropped"] == ["--host", "0.0.0.0"] and dropped["model"] == "chat"
