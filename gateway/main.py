"""``llmgw gateway``: the process. Builds the state, the follower, the signals and the
HTTP server, and runs them on one uvloop event loop until SIGTERM or SIGINT.

On SIGTERM the server stops accepting, waits for the requests in flight to finish (up
to ``GRACE_S``), then stops following the control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys

import structlog
import uvicorn

from gateway.follower import Follower
from gateway.proxy import Proxy
from gateway.server import GatewayApp, guarded
from gateway.settings import GatewaySettings
from gateway.signals import Signals
from gateway.state import State
from gateway.upstream import Upstream

log = structlog.get_logger("gateway")
# How long a stop waits for the requests in flight (a long stream may take minutes; a
# deployment that needs more stops new traffic first).
GRACE_S = 60


def listen(host: str, port: int) -> socket.socket:
    sock = socket.create_server((host, port), reuse_port=False)
    sock.setblocking(False)
    return sock


def run(settings: GatewaySettings, sock: socket.socket) -> int:
    import uvloop

    return uvloop.run(_serve(settings, sock))


async def _serve(settings: GatewaySettings, sock: socket.socket) -> int:
    state = State(settings.gateway_id)
    upstream = Upstream(
        settings.connect_timeout_s, settings.read_timeout_s, settings.tokenize_cache_s
    )
    follower = Follower(state, settings.server, settings.token, settings.resync_s)
    signals = Signals(state, settings.server, settings.token, settings.signals_interval_s)
    tasks: list[asyncio.Task[None]] = []

    async def startup() -> None:
        tasks.append(asyncio.create_task(follower.run()))
        tasks.append(asyncio.create_task(signals.run()))

    async def shutdown() -> None:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(Exception):
            await signals.post_once()
        await follower.close()
        await signals.close()
        await upstream.close()

    app = GatewayApp(state, Proxy(state, upstream, settings), settings, startup, shutdown)
    config = uvicorn.Config(
        guarded(app),
        loop="none",
        http="httptools",
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GRACE_S,
        timeout_keep_alive=30,
    )
    server = uvicorn.Server(config)
    host, port = sock.getsockname()[:2]
    log.info("gateway.listening", url=f"http://{host}:{port}", control_plane=settings.server)
    print(f"llmgw gateway: listening on http://{host}:{port}", flush=True)
    await server.serve(sockets=[sock])
    log.info("gateway.stopped")
    sys.stdout.flush()
    return 0
