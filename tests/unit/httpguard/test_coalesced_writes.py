"""``coalesce_writes`` (the gateway's server): answers whole, streams never held back.

A real uvicorn server on a real socket, in this test's event loop, with the guarded
protocol as the gateway configures it.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn

from httpguard import HeadLimits
from httpguard.protocol import uvicorn_options

BODY = b'{"answer":"whole"}'


class App:
    """``/whole``: one answer; ``/stream``: a piece, then a second only once the client
    says it has the first (a first piece held back would leave both waiting)."""

    def __init__(self) -> None:
        self.client_has_first = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/whole":
            headers = [(b"content-type", b"application/json"), (b"content-length", b"18")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": BODY})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first;", "more_body": True})
        await self.client_has_first.wait()
        await send({"type": "http.response.body", "body": b"second;"})


async def _serve(app: App) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        loop="none",
        lifespan="off",
        log_level="warning",
        **uvicorn_options(HeadLimits(), coalesce_writes=True),
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, sock.getsockname()[1]


async def _head_and_rest(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    return head, head.split(b"\r\n", 1)[0]


def test_whole_answers_over_keep_alive_and_a_stream_piece_by_piece() -> None:
    async def main() -> None:
        app = App()
        server, task, port = await _serve(app)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(3):
            writer.write(b"GET /whole HTTP/1.1\r\nhost: t\r\n\r\n")
            head, status = await _head_and_rest(reader)
            assert status == b"HTTP/1.1 200 OK"
            assert await reader.readexactly(len(BODY)) == BODY
        writer.write(b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n")
        head, status = await _head_and_rest(reader)
        assert b"transfer-encoding: chunked" in head
        size = await reader.readuntil(b"\r\n")
        first = await reader.readexactly(int(size, 16) + 2)
        assert first == b"first;\r\n", "the first piece was held back"
        app.client_has_first.set()
        rest = await reader.readuntil(b"0\r\n\r\n")
        assert b"second;" in rest
        writer.close()
        server.should_exit = True
        await task

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_refused_head_is_still_answered_before_the_close() -> None:
    async def main() -> None:
        server, task, port = await _serve(App())
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /whole HTTP/1.1\r\nhost: t\r\nx-big: " + b"a" * 100_000 + b"\r\n\r\n")
        answer = await reader.read(4096)
        assert answer.startswith(b"HTTP/1.1 431 ")
        writer.close()
        server.should_exit = True
        await task

    asyncio.run(asyncio.wait_for(main(), 30))
