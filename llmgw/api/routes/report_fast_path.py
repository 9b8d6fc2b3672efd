"""The node report's common case, answered before FastAPI's router: same contract, less work.

A fleet of 10,000 agents reporting every 10 s sends 1,000 reports a second,
nearly all of them small JSON heartbeats that change nothing. Through FastAPI
each paid for routing, dependency resolution, a ``Request``, and a worker thread
for parsing and another wait for the group commit: most of a report's CPU.
This ASGI middleware sits inside ``RequestLog`` (so the access log and the
metrics are the same) and before FastAPI's own middleware (``app._Api``), and
takes a request only when it is plainly the common case:

- ``PUT /v1/nodes/{name}`` exactly (a name with no ``/``), no query string;
- ``Authorization: Bearer <token>`` of a configured token that may report that
  node, and a node name that is text;
- a ``Content-Length`` within ``LEAN_BODY_BYTES`` (and the body limit).

Anything else goes to FastAPI untouched, which answers it exactly as before
(401, 403, 413, 422, chunked or large bodies, YAML). The body is received on
the event loop, bounded; it is parsed in the group commit's writer thread
(``llmgw.api.reports.node_reports``), never on the loop, and only if it is JSON: any
other body is handed to FastAPI with the bytes already received, and the route
reads it in a worker thread as before. A refusal found while parsing or writing
is answered by the app's own exception handlers, so its problem document is
the one the route would have sent; so is any unexpected failure of this path
(a 500 problem document, logged as ``api.error``), never the server's plain 500.
The OpenAPI document still describes this route: it is FastAPI's, whose handler
serves everything this path declines.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmgw.api.guards.bodies import declared_length, text_problem
from llmgw.api.guards.tokens import Principal
from llmgw.api.rendering.problems import json_text
from llmgw.api.reports.node_reports import Body, NotJSON, unstorable
from llmgw.api.routes.nodes import report_answer
from llmgw.api.runtime.services import Services

PREFIX = "/v1/nodes/"
# Larger bodies (a report of many replicas) take the general route: what the writer
# thread parses stays small, so one report cannot hold up a batch for long.
LEAN_BODY_BYTES = 16 << 10
_JSON_HEADERS = [(b"content-type", b"application/json")]


class ReportPath:
    def __init__(
        self, app: ASGIApp, services: Services, route: Any, handlers: dict[Any, Any]
    ) -> None:
        self.app = app
        self.svc = services
        # The FastAPI route this path stands in for: RequestLog labels metrics with it.
        self.route = route
        # The app's exception handlers (llmgw.api.rendering.problems), to answer refusals
        # as it does.
        self.handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "PUT"
            or not scope["path"].startswith(PREFIX)
        ):
            await self.app(scope, receive, send)
            return
        # FastAPI's error middleware is not around this path: an unexpected failure here
        # would reach the server, which answers a plain-text 500. Answered as the app does.
        try:
            taken = self._take(scope)
        except Exception as exc:
            await self._refuse(scope, receive, send, exc)
            return
        if taken is None:
            await self.app(scope, receive, send)
            return
        name, who, length = taken
        received: list[Message] = []
        body = bytearray()
        try:
            while True:
                message = await receive()
                received.append(message)
                if message["type"] != "http.request":
                    break
                body += message.get("body", b"")
                if not message.get("more_body", False) or len(body) > length:
                    break
        except Exception as exc:
            await self._refuse(scope, _replay(received, receive), send, exc)
            return
        if received[-1]["type"] != "http.request" or len(body) != length:
            # A client that went away or sent other than it declared: the route says what.
            await self.app(scope, _replay(received, receive), send)
            return
        scope.setdefault("state", {})["actor"] = who.name
        scope["route"] = self.route
        svc = self.svc
        try:
            recorded = await svc.reports.submit_async(
                (Body(name, bytes(body), svc.settings.max_body_bytes), who.name)
            )
            answer = json_text(report_answer(svc, recorded), ensure_ascii=False).encode("utf-8")
        except NotJSON:
            await self.app(scope, _replay(received, receive), send)
            return
        except OverflowError as exc:
            await self._refuse(scope, receive, send, unstorable(exc))
            return
        except Exception as exc:  # as above: the app's answer, not the server's
            await self._refuse(scope, receive, send, exc)
            return
        svc.metrics.node_reports.inc()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(len(answer)).encode()), *_JSON_HEADERS],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    def _take(self, scope: Scope) -> tuple[str, Principal, int] | None:
        """The node, the caller and the body's length, if this is the common case."""
        name: str = scope["path"][len(PREFIX) :]
        if not name or "/" in name or scope.get("query_string") or scope.get("root_path"):
            return None
        authorization = length = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                if authorization is None:  # the first, as Starlette's headers.get reads it
                    authorization = value
            elif key == b"content-length":
                length = value
            elif key == b"transfer-encoding":
                return None
        size = None if length is None else declared_length(length)
        if authorization is None or size is None:
            return None
        if size > min(LEAN_BODY_BYTES, self.svc.settings.max_body_bytes):
            return None
        scheme, _, token = authorization.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        who = self.svc.book.verify(token.strip())
        if who is None or not who.may_report(name) or text_problem(name, "") is not None:
            return None
        return name, who, size

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, exc: Exception) -> None:
        """Answer ``exc`` with the app's handler for it, as FastAPI's stack would have."""
        for kind in type(exc).__mro__:
            handler = self.handlers.get(kind)
            if handler is not None:
                response = await handler(Request(scope, receive), exc)
                await response(scope, receive, send)
                return
        raise exc


def _replay(received: list[Message], receive: Receive) -> Receive:
    """``receive`` as if nothing had been read: the messages taken so far, then the rest."""
    pending = list(received)

    async def again() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return again
