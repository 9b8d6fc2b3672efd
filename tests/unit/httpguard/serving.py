"""A guarded uvicorn server on a loopback port, for the httpguard tests that need a real one."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from httpguard import HeadLimits, uvicorn_options


@asynccontextmanager
async def guarded_server(
    app: Any,
    limits: HeadLimits | None = None,
    *,
    coalesce: bool,
    request_id: Callable[[], str] | None = None,
) -> AsyncIterator[socket.socket]:
    """Serve ``app`` with httpguard's protocol until the block ends; yields the listening socket."""
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        loop="none",
        lifespan="off",
        log_level="critical",
        **uvicorn_options(limits or HeadLimits(), coalesce_writes=coalesce, request_id=request_id),
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield sock
    finally:
        server.should_exit = True
        await task
