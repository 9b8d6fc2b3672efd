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


def test_props_nested_past_the_parsers_depth_break_no_other_replicas_slots() -> None:
    """Attack: an engine answers /props with JSON nested 100,000 deep (within the 1 MB read):
    json.loads raised RecursionError, which ask() did not catch; the whole check raised,
    the gateway's engine-slots task ended for good (an exception nobody waits for), and no
    replica, this one or any started after, had its slots learned again."""
    import http.server
    import threading

    class Hostile(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"[" * 100_000 + b"]" * 100_000
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    hostile = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=hostile.serve_forever, daemon=True).start()
    try:
        with sim_engine("--slots", "5", model="tiny") as port:

            async def scenario() -> list[tuple[int, str]]:
                state = State("gw-test")
                rows = placements(hostile.server_address[1], port)

                def reinstall() -> None:
                    state.install(build([MODEL], rows, 1, state.engine_slots))

                state.install(build([MODEL], rows, 1))
                slots = EngineSlots(state, reinstall, timeout_s=5)
                try:
                    await slots.check()
                finally:
                    await slots.close()
                return [(r.slots, r.slots_source) for r in state.table.ready["tiny"]]

            seen = asyncio.run(scenario())
    finally:
        hostile.shutdown()
    assert seen == [(2, "args"), (5, "engine")]
