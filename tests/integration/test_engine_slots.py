"""The gateway asks a llama.cpp replica's engine for its slots (``GET /props``
``total_slots``) and builds its next table with them; an engine that cannot be reached
is asked again a few times, then its args stay in force. A real engine process answers
(the sim, which says its slots on /props as llama.cpp does); a real llama-server is in
tests/e2e/test_llamacpp.py."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from agent.processes import free_port
from catalog.definition.parse import parse_model
from gateway.engineslots import RETRIES_S, EngineSlots
from gateway.state import State
from gateway.table import build
from tests.integration.sim_process import sim_engine

MODEL = parse_model(
    {
        "name": "tiny",
        "source": "org/tiny",
        "profiles": [{"name": "cpu", "engine": "llamacpp", "args": ["--parallel", "2"]}],
    }
)


def placements(*ports: int) -> list[dict[str, Any]]:
    return [
        {
            "model": "tiny",
            "replica": i,
            "state": "ready",
            "endpoint": f"http://127.0.0.1:{port}",
            "profile": "cpu",
        }
        for i, port in enumerate(ports)
    ]


def test_the_engines_total_slots_go_into_the_next_table_and_a_silent_one_keeps_its_args() -> None:
    with sim_engine("--slots", "5", model="tiny") as port:
        dead = free_port("127.0.0.1")  # nothing listens there

        async def scenario() -> tuple[list[tuple[int, str]], int, dict[Any, float]]:
            state = State("gw-test")
            rows = placements(port, dead)
            installs = 0

            def reinstall() -> None:
                nonlocal installs
                installs += 1
                state.install(build([MODEL], rows, 1, state.engine_slots))

            state.install(build([MODEL], rows, 1))
            slots = EngineSlots(state, reinstall, timeout_s=5)
            try:
                await slots.check()
                # The one that answered: at once; the other waits for its next try.
                assert slots._next[("tiny/1", f"http://127.0.0.1:{dead}")] > 0
                for _ in RETRIES_S:
                    for where in slots._next:
                        slots._next[where] = 0.0  # its pause is over
                    await slots.check()
            finally:
                await slots.close()
            seen = [(r.slots, r.slots_source) for r in state.table.ready["tiny"]]
            return seen, installs, dict(slots._next)

        seen, installs, pending = asyncio.run(scenario())
    assert seen == [(5, "engine"), (2, "args")]
    assert installs == 1  # one new table, when the engine said its slots
    # Tried 1 + len(RETRIES_S) times, then left to its args: never asked again.
    assert list(pending.values()) == [math.inf]
