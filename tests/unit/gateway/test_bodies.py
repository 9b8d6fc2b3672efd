"""gateway.bodies: an answer that comes in parts (a large one, a real network) is read
whole by every edge that parses one; ``StreamReader.read(n)`` returned its first part."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.engineslots import EngineSlots
from gateway.follower import Follower
from gateway.state import State
from tests.unit.gateway.local_app import served


async def _serving_in_parts(path: str, body: bytes, run: Callable[[str], Awaitable[Any]]) -> Any:
    """``run(base URL)`` against a server that writes ``body`` in two parts."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "application/json"})
        await resp.prepare(request)
        await resp.write(body[:100])
        await asyncio.sleep(0.05)
        await resp.write(body[100:])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get(path, handler)
    async with served(app) as url:
        return await run(url)


def test_the_placements_feed_that_comes_in_parts_is_read_whole() -> None:
    """On main the follower parsed the feed's first part: JSONDecodeError, the last
    table kept, and again at every attempt: a feed larger than what one read brings
    (a large fleet, a real network) was never read."""
    placements = [
        {"model": "m", "replica": i, "state": "ready", "endpoint": f"http://h:{i}"}
        for i in range(20)
    ]

    async def run(base: str) -> int:
        follower = Follower(State("gw"), base, "t", 5.0)
        try:
            await follower.read_placements()
        finally:
            await follower.close()
        return len(follower.placements)

    body = json.dumps(placements).encode()
    assert asyncio.run(_serving_in_parts("/v1/placements", body, run)) == 20


def test_an_engines_props_that_come_in_parts_are_read_whole() -> None:
    """llama.cpp's ``/props`` carries its chat template (KBs): on main only its first
    part was parsed, and the replica's slots were not learned (no limit, never full)."""
    props = {"chat_template": "x" * 4000, "total_slots": 4}

    async def run(base: str) -> tuple[int, str]:
        slots = EngineSlots(State("gw"), lambda: None, timeout_s=5)
        try:
            return await slots.ask(("m/0", base))
        finally:
            await slots.close()

    assert asyncio.run(_serving_in_parts("/props", json.dumps(props).encode(), run)) == (4, "")
