"""One structured log line per request (``api.request``) and the HTTP metrics.

A plain ASGI middleware rather than Starlette's ``BaseHTTPMiddleware``: it
neither buffers nor wraps streaming responses, so an event stream is logged
once, when it closes, with its whole duration.
"""

from __future__ import annotations

import time

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmgw.api.metrics import Metrics

log = structlog.get_logger("llmgw.api")


class RequestLog:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets if the app fails before answering
        state = scope.setdefault("state", {})

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            elapsed = time.perf_counter() - started
            # The route's template (bounded), never the path (unbounded, and 404s could
            # make a label per probe).
            route = getattr(scope.get("route"), "path", "unmatched").replace(":path", "")
            method = scope["method"]
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.request_seconds.labels(method, route).observe(elapsed)
            log.info(
                "api.request",
                method=method,
                path=scope["path"],
                status=status,
                duration_ms=round(elapsed * 1000, 2),
                actor=state.get("actor"),
            )
