"""An aiohttp application served on a free loopback port, for the gateway's tests of
what it reads from engines and from the control plane."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from aiohttp import web


@asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` until the block ends; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextmanager
def served_elsewhere(app: web.Application) -> Iterator[str]:
    """Serve ``app`` on a thread and event loop of its own until the block ends; yields its
    base URL. For a test that measures what the caller's event loop spends (its thread's
    CPU): the server's own work is then not counted in it."""
    loop = asyncio.new_event_loop()
    started: concurrent.futures.Future[str] = concurrent.futures.Future()
    stop = asyncio.Event()

    async def serve() -> None:
        async with served(app) as url:
            started.set_result(url)
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield started.result(timeout=30)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()
