"""One structured log line per request (``api.request``) and the HTTP metrics.

A plain ASGI middleware rather than Starlette's ``BaseHTTPMiddleware``: it
neither buffers nor wraps streaming responses, so an event stream is logged
once, when it closes, with its whole duration.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmgw.api.telemetry.metrics import Metrics

log = structlog.get_logger("llmgw.api")


class RequestLog:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        # Each label set's series, looked up once: prometheus_client's labels() takes a
        # lock and checks every value on each call, a few percent of a node report.
        self._counted: dict[tuple[str, str, str], Any] = {}
        self._timed: dict[tuple[str, str], Any] = {}

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
            counted = (method, route, str(status))
            series = self._counted.get(counted)
            if series is None:
                series = self._counted[counted] = self.metrics.requests.labels(*counted)
            series.inc()
            timed = self._timed.get((method, route))
            if timed is None:
                timed = self._timed[method, route] = self.metrics.request_seconds.labels(
                    method, route
                )
            timed.observe(elapsed)
            log.info(
                "api.request",
                method=method,
                path=scope["path"],
                status=status,
                duration_ms=round(elapsed * 1000, 2),
                actor=state.get("actor"),
            )
