"""The API server's answers leave whole: head and body in one write.

Behind a balancer (docs/operator/haproxy.cfg), a replica killed while answering a read
is retried on another replica only if it sent nothing: a head already sent is half an
answer the balancer must pass on, and the client sees a broken connection. uvicorn
writes a head and its body apart; the API's server joins them."""

from __future__ import annotations

import asyncio
import select
import socket
from typing import Any

import uvicorn

from httpguard import HeadLimits
from llmgw.api.server import server_options


def test_an_api_answers_head_does_not_leave_before_its_body() -> None:
    readable_between: list[bool] = []
    client: list[socket.socket] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-length", b"5")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        # Without yielding to the loop: is any of the answer on its way yet?
        ready, _, _ = select.select([client[0]], [], [], 0.3)
        readable_between.append(bool(ready))
        await send({"type": "http.response.body", "body": b"whole"})

    async def main() -> bytes:
        sock = socket.create_server(("127.0.0.1", 0))
        config = uvicorn.Config(
            app, loop="none", lifespan="off", log_level="critical", **server_options(HeadLimits())
        )
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        try:
            conn = socket.create_connection(sock.getsockname()[:2])
            client.append(conn)
            conn.sendall(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
            conn.setblocking(False)
            got = b""
            while not got.endswith(b"whole"):
                try:
                    got += conn.recv(65536)
                except BlockingIOError:
                    await asyncio.sleep(0.01)
            conn.close()
            return got
        finally:
            server.should_exit = True
            await task

    got = asyncio.run(asyncio.wait_for(main(), 30))
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"\r\n\r\nwhole"), got
    assert readable_between == [False], "the head left before its body"
