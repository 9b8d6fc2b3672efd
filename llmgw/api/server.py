"""Running the app on uvicorn: a socket we bind ourselves, a stop that ends event streams.

Binding first (rather than letting uvicorn) is what makes ``--port 0`` useful:
the port the kernel picked is known before the server starts, and printed.
"""

from __future__ import annotations

import socket
import threading
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from httpguard.limits import HeadLimits
from httpguard.protocol import uvicorn_options


class StoppingServer(uvicorn.Server):
    """Tells open event streams to end as soon as a stop is asked for, so the graceful
    shutdown does not wait out its timeout on followers that never hang up."""

    def __init__(self, config: uvicorn.Config, stopping: threading.Event) -> None:
        super().__init__(config)
        self.stopping = stopping

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.stopping.set()
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # A stop asked before uvicorn's signal handlers were in place (``llmgw serve``
        # sets ``stopping`` from its own handler then): honoured now, not lost.
        if self.stopping.is_set():
            self.should_exit = True


def listen(host: str, port: int) -> socket.socket:
    """A bound socket (``OSError`` if the address is taken or not ours)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on such sockets (and on the
    # connections accepted from them). Without it every response waits ~40 ms for
    # Nagle's algorithm and the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def server_options(limits: HeadLimits) -> dict[str, Any]:
    """The protocol options of the API's uvicorn server."""
    # httptools (a C parser) rather than h11 (pure Python): h11 was a fifth of the
    # server's CPU per node report, and agents' heartbeats are most of its requests.
    # httptools bounds nothing in a request's head: httpguard's subclass of its
    # protocol does (size, count, time, connections), and sets the keep-alive timeout.
    # An answer's head and body leave in one write (uvicorn makes two): a replica
    # killed between them behind a balancer left a client half an answer, which no
    # balancer may retry, where an answer not begun is retried on another replica;
    # and one system call a request fewer.
    return uvicorn_options(limits, coalesce_writes=True)


def run(
    app: FastAPI,
    sock: socket.socket,
    stopping: threading.Event,
    limits: HeadLimits | None = None,
) -> bool:
    """Serve until SIGTERM or SIGINT; whether the app started at all."""
    config = uvicorn.Config(
        app,
        **server_options(limits or HeadLimits()),
        log_config=None,
        access_log=False,  # api.request is the access log
        server_header=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = StoppingServer(config, stopping)
    server.run(sockets=[sock])
    return server.started
