"""A client that stops reading is dropped after ``write_timeout_s`` (a slow-read attack).

Without it, a client that asks for a long answer and reads none of it holds its
request for ever, and, on the gateway, the engine's slot and connection behind it.
A real uvicorn server with the guarded protocol, on a real socket; the client is a
plain socket with a small receive buffer that never reads.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest

from httpguard import HeadLimits
from tests.unit.httpguard.serving import guarded_server

BLOCK = b"z" * 65536


class Endless:
    """Streams blocks until it learns the client is gone; records how it ended."""

    def __init__(self) -> None:
        self.ended: asyncio.Future[str] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        assert self.ended is not None
        ended = self.ended

        async def watch() -> None:  # as the gateway does: the client gone ends the answer
            while (await receive())["type"] != "http.disconnect":
                pass
            ended.set_result("http.disconnect")

        watcher = asyncio.create_task(watch())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        while not ended.done():
            await send({"type": "http.response.body", "body": BLOCK, "more_body": True})
            await asyncio.sleep(0.001)
        await watcher


@pytest.mark.parametrize("coalesce", [False, True], ids=["api", "gateway"])
def test_a_client_that_stops_reading_is_dropped_after_the_write_timeout(coalesce: bool) -> None:
    async def main() -> None:
        app = Endless()
        app.ended = asyncio.get_running_loop().create_future()
        async with guarded_server(app, HeadLimits(write_timeout_s=0.5), coalesce=coalesce) as sock:
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.connect(sock.getsockname())
            client.sendall(b"GET /endless HTTP/1.1\r\nhost: t\r\n\r\n")
            began = time.monotonic()
            # The hang guard only: the verdict is that the application saw the client go.
            ended = await asyncio.wait_for(app.ended, 20)
            assert ended, "the application was never told the client went away"
            assert time.monotonic() - began >= 0.5
            client.close()

    asyncio.run(main())


def test_the_write_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="write_timeout_s"):
        HeadLimits(write_timeout_s=0)
