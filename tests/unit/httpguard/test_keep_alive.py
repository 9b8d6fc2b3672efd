"""The keep-alive timeout of the guarded protocol: one timer per connection, same timeout.

uvicorn armed a timer at the end of every response and cancelled it at the next
request; the guarded protocol keeps one per connection that checks when the connection
went idle. An idle connection must still close ``keep_alive_timeout_s`` after its last
response (not after an earlier one), and a busy one must not be closed. A real uvicorn
server on a real socket, in this test's event loop (asyncio's, whose ``call_at`` and
``call_later`` can be counted).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from httpguard import HeadLimits
from tests.unit.httpguard.serving import guarded_server

TIMEOUT = 0.5


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


def test_an_idle_connection_closes_a_timeout_after_its_last_response_with_one_timer() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        timers = 0
        call_at, call_later = loop.call_at, loop.call_later

        def counting_at(when: float, *args: Any, **kw: Any) -> asyncio.TimerHandle:
            nonlocal timers
            timers += 1
            return call_at(when, *args, **kw)

        def counting_later(delay: float, *args: Any, **kw: Any) -> asyncio.TimerHandle:
            nonlocal timers
            timers += 1
            return call_later(delay, *args, **kw)

        async with guarded_server(
            app, HeadLimits(keep_alive_timeout_s=TIMEOUT), coalesce=True
        ) as sock:
            reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            loop.call_at = counting_at  # type: ignore[method-assign,assignment]
            loop.call_later = counting_later  # type: ignore[method-assign,assignment]
            try:
                for _ in range(20):
                    writer.write(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
                    await reader.readuntil(b"\r\n\r\nok")
                assert timers <= 2, f"{timers} timers for 20 requests on one connection"
                # Busy past the first response's timeout: requests keep coming, each within it.
                for _ in range(4):
                    await asyncio.sleep(TIMEOUT * 0.6)
                    writer.write(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
                    await reader.readuntil(b"\r\n\r\nok")
                last = time.monotonic()
                assert await asyncio.wait_for(reader.read(), 10) == b"", "not closed when idle"
                idle = time.monotonic() - last
                assert TIMEOUT * 0.9 <= idle < TIMEOUT + 1.0, f"closed after {idle:.2f}s idle"
            finally:
                loop.call_at, loop.call_later = call_at, call_later  # type: ignore[method-assign]
                writer.close()

    asyncio.run(asyncio.wait_for(main(), 30))
