"""``ON_DISCONNECT``: the guarded protocol tells an application its client went away.

The gateway used to learn it from a task per request awaiting ``receive()`` for
``http.disconnect``; the protocol now calls the callback the request registered, from
``connection_lost``, and only while the response is incomplete. A real uvicorn server
with the guarded protocol, on a real socket.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvicorn

from httpguard import HeadLimits
from httpguard.protocol import ON_DISCONNECT, uvicorn_options

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


async def _serve(
    app: App, coalesce: bool, body: Callable[[socket.socket], Awaitable[None]]
) -> None:
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        loop="none",
        lifespan="off",
        log_level="critical",
        **uvicorn_options(HeadLimits(), coalesce_writes=coalesce),
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    client = socket.socket()
    client.connect(sock.getsockname())
    try:
        await body(client)
    finally:
        client.close()
        server.should_exit = True
        await task


@pytest.mark.parametrize("coalesce", [False, True], ids=["api", "gateway"])
def test_a_client_gone_mid_request_calls_its_callback_once(coalesce: bool) -> None:
    calls: list[str] = []
    registered = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        watch = scope["extensions"][ON_DISCONNECT]
        task = asyncio.current_task()
        assert task is not None

        def gone() -> None:
            calls.append("gone")
            task.cancel()

        watch(gone)
        registered.set()
        try:
            await asyncio.sleep(30)  # an upstream that takes its time
        except asyncio.CancelledError:
            calls.append("cancelled")
            raise

    async def body(client: socket.socket) -> None:
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}"
        )
        await asyncio.wait_for(registered.wait(), 10)
        client.close()
        for _ in range(500):
            if "cancelled" in calls:
                break
            await asyncio.sleep(0.01)

    asyncio.run(asyncio.wait_for(_serve(app, coalesce, body), 30))
    assert calls == ["gone", "cancelled"]


def test_a_client_gone_after_its_answer_or_after_unregistering_calls_nothing() -> None:
    calls: list[str] = []
    answered = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        watch = scope["extensions"][ON_DISCONNECT]
        watch(lambda: calls.append(scope["path"]))
        if scope["path"] == "/unregistered":
            watch(None)
            await asyncio.sleep(0.5)  # the client leaves meanwhile
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        answered.set()

    async def answered_then_gone(client: socket.socket) -> None:
        client.sendall(b"GET /answered HTTP/1.1\r\nhost: t\r\n\r\n")
        await asyncio.wait_for(answered.wait(), 10)
        client.close()
        await asyncio.sleep(0.2)

    async def unregistered(client: socket.socket) -> None:
        client.sendall(b"GET /unregistered HTTP/1.1\r\nhost: t\r\n\r\n")
        await asyncio.sleep(0.2)
        client.close()
        await asyncio.sleep(0.5)

    asyncio.run(asyncio.wait_for(_serve(app, True, answered_then_gone), 30))
    asyncio.run(asyncio.wait_for(_serve(app, True, unregistered), 30))
    assert calls == []
