"""gateway.engineload against a hostile or broken engine: whatever its ``/metrics`` or
``/slots`` answers, the reading loop goes on, and the replica's limit is its deal unless
a whole answer said slots were idle."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from aiohttp import web

from gateway.engineload import EngineLoad
from gateway.stages.borrow import Reading
from gateway.stages.slotshare import Members
from gateway.state import State
from gateway.table import Replica, Table
from tests.unit.gateway.local_app import served

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
IDLE = b'vllm:num_requests_running{model_name="m"} 0\nvllm:num_requests_waiting{model_name="m"} 0\n'


def _state(endpoint: str, engine: str) -> tuple[State, Replica]:
    """One replica of 4 slots, dealt 2 of them here (two gateways)."""
    r = Replica("m/0", "m", endpoint, 1.0, "p", slots=4, engine=engine)
    state = State("gw")
    state.table = Table(ready={"m": (r,)})
    state.members = Members(2, 0)
    state.redeal()
    return state, r


async def _with_engine(
    routes: dict[str, Handler], engine: str, run: Callable[[State, EngineLoad], Awaitable[Any]]
) -> Any:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    async with served(app) as url:
        state, _ = _state(url, engine)
        load = EngineLoad(state)
        try:
            return await run(state, load)
        finally:
            await load.close()


def _answer(body: bytes) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body)

    return handler


async def _check_twice(state: State, load: EngineLoad) -> dict[str, int]:
    await load.check()
    load._last.clear()  # (read again now, not POLL_S later)
    await load.check()
    return dict(state.dealt)


def test_a_deeply_nested_slots_or_metrics_adding_past_a_float_do_not_end_the_loop() -> None:
    """A llama.cpp whose ``/slots`` nests past the parser's depth (RecursionError), or a
    ``/metrics`` whose finite counts add up to inf (OverflowError in ``int``): on main the
    exception left ``check`` and ended the engine-load task for good, borrowing gone and
    the limits in force frozen. Now the replica is unread (its deal) and the loop goes on."""

    async def no_metrics(request: web.Request) -> web.StreamResponse:
        return web.Response(status=501)  # (llama.cpp without --metrics: /slots next)

    nested = {"/metrics": no_metrics, "/slots": _answer(b"[" * 100_000 + b"]" * 100_000)}
    assert asyncio.run(_with_engine(nested, "llamacpp", _check_twice)) == {"m/0": 2}
    huge = b"vllm:num_requests_running 1e308\nvllm:num_requests_waiting 1e308\n"
    assert asyncio.run(_with_engine({"/metrics": _answer(huge)}, "vllm", _check_twice)) == {
        "m/0": 2
    }


def _in_parts(*parts: bytes) -> Handler:
    """An answer written in parts, a moment apart (a slow network, a large answer)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i, part in enumerate(parts):
            if i:
                await asyncio.sleep(0.05)
            await resp.write(part)
        await resp.write_eof()
        return resp

    return handler


def test_an_answer_that_comes_in_parts_is_read_whole() -> None:
    """``StreamReader.read(n)`` returns what has come so far: on main a ``/metrics``
    whose waiting count came a moment after its running count read as 0 busy, and the 3
    slots the others' 7 requests fill were lent."""
    metrics = _in_parts(
        b'vllm:num_requests_running{model_name="m"} 0\n',
        b'vllm:num_requests_waiting{model_name="m"} 7\n',
    )

    async def run(state: State, load: EngineLoad) -> Any:
        (r,) = state.table.ready["m"]
        return await load.read(r)

    reading = asyncio.run(_with_engine({"/metrics": metrics}, "vllm", run))
    assert reading is not None and reading.others == 7


def test_a_replica_key_back_under_another_engine_is_read_where_that_engine_says() -> None:
    """A llama.cpp without ``--metrics`` and with ``--no-slots`` (both refused) is left
    unread, then leaves; its key comes back as a vLLM replica. On main the key's path
    (``/slots``) was kept, asked of vLLM, and ``paths.index`` raised ValueError: the
    engine-load task ended for good."""

    async def refused(request: web.Request) -> web.StreamResponse:
        return web.Response(status=501)

    async def run(state: State, load: EngineLoad) -> Any:
        (r,) = state.table.ready["m"]
        await load.check()  # both refused: unread, paused
        state.table = Table()
        await load.check()  # gone
        state.table = Table(ready={"m": (replace(r, engine="vllm"),)})
        state.redeal()
        await load.check()
        return dict(state.dealt), load._path

    assert asyncio.run(_with_engine({"/metrics": refused, "/slots": refused}, "llamacpp", run)) == (
        {"m/0": 2},
        {},
    )


def test_readings_from_before_a_replica_went_unread_do_not_make_its_span() -> None:
    """Read idle while two gateways were live, then dealt all of it (the other gone:
    not read), then the other back. On main the readings of minutes ago stood for the
    span's start, and one fresh reading of a slot idle for a moment lent it at once:
    the bound's 'every reading over at least SPAN_S' held by no reading in between."""

    async def run(state: State, load: EngineLoad) -> Any:
        now = time.monotonic()
        old = (Reading(0, now - 120.0), Reading(0, now - 119.0))  # (read then)
        state.readings["m/0"], load._last["m/0"] = old, old[-1]
        state.join(Members(1, 0))  # the other gone: all 4 dealt here, not read
        assert not load.due(now)
        state.join(Members(2, 0))  # back
        await load.check()
        return dict(state.dealt)

    assert asyncio.run(_with_engine({"/metrics": _answer(IDLE)}, "vllm", run)) == {"m/0": 2}


def test_an_engine_slow_to_answer_does_not_slow_the_reading_of_the_others() -> None:
    """One engine answers each reading 0.9 s late (within the timeout, so it is never
    left unread). On main a round awaited every read: the other replica was read once
    a second instead of every POLL_S (once in the test's second, 10 times now), and the
    bound's 'no new slot borrowed from the next reading on (0.1 s)' became a second,
    for every replica of the gateway."""
    hits = {"fast": 0}

    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.9)
        return web.Response(body=IDLE)

    async def fast(request: web.Request) -> web.StreamResponse:
        hits["fast"] += 1
        return web.Response(body=IDLE)

    async def main() -> int:
        apps = []
        for handler in (slow, fast):
            app = web.Application()
            app.router.add_get("/metrics", handler)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            apps.append((runner, f"http://127.0.0.1:{port}"))
        replicas = tuple(
            Replica(f"m/{i}", "m", url, 1.0, "p", slots=4, engine="vllm")
            for i, (_, url) in enumerate(apps)
        )
        state = State("gw")
        state.table = Table(ready={"m": replicas})
        state.join(Members(2, 0))
        load = EngineLoad(state)
        task = asyncio.create_task(load.run())
        try:
            await asyncio.sleep(1.0)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await load.close()
            for runner, _ in apps:
                await runner.cleanup()
        return hits["fast"]

    assert asyncio.run(main()) >= 5


def test_an_engine_still_on_the_key_before_a_rotation_is_read_with_that_key() -> None:
    """The documented rotation: the gateways take the new key first, and an engine keeps
    the one it was started with until it restarts (llama.cpp and the sim refuse
    ``/metrics`` and ``/slots`` without it). On main the count was asked with the new
    key alone: refused, the replica unread (no borrowing there until its restart), and
    a llama.cpp's path moved to ``/slots`` for good, as if it had no ``--metrics``."""
    heard: list[str] = []

    async def metrics(request: web.Request) -> web.StreamResponse:
        heard.append(request.headers.get("authorization", ""))
        if request.headers.get("authorization") != "Bearer old":
            return web.Response(status=401)
        return web.Response(body=b"llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n")

    async def run(state: State, load: EngineLoad) -> Any:
        (r,) = state.table.ready["m"]
        rotated = replace(
            r, auth=b"authorization: Bearer new\r\n", auth_previous=b"authorization: Bearer old\r\n"
        )
        state.table = Table(ready={"m": (rotated,)})
        return await load.read(rotated), dict(load._path)

    reading, paths = asyncio.run(_with_engine({"/metrics": metrics}, "llamacpp", run))
    assert reading is not None and reading.others == 1
    assert paths == {}
    assert heard == ["Bearer new", "Bearer old"]
