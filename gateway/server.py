"""The gateway's HTTP side: a raw ASGI app on uvicorn (httptools parser, uvloop loop).

Chosen by measurement (``python -m bench.gateway.choice``, 2 cores under load): a raw
ASGI app on uvicorn with aiohttp's client added 0.34 ms p50 / 5.2 ms p99 at concurrency
1, against 0.46 / 7.9 ms for aiohttp's own server with the same client, and about the
same at 16. A framework (FastAPI, Starlette's routing) would add its dependency graph
and middleware stack to every request for four routes; the routes here are a dict.

Routes: ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``;
``GET /v1/models``, ``/v1/models/{id}``; ``/healthz``, ``/metrics``, ``/routing``.
Every error is OpenAI's shape. A body is read with a cap and parsed on the event loop
when small, in a worker thread when large, so no request holds the others up.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from catalog.forms.client_limits import NO_LIMITS
from gateway.proxy import INLINE_JSON, Call, Proxy, Trace
from gateway.settings import GatewaySettings
from gateway.stages import admission
from gateway.stages.admission import Refusal
from gateway.stages.queue import RANK, lowered
from gateway.state import Client, State
from httpguard.protocol import HOOKS, RequestHooks

log = structlog.get_logger("gateway")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

INFERENCE = {
    "/v1/chat/completions": admission.CHAT,
    "/v1/completions": admission.COMPLETIONS,
    "/v1/embeddings": admission.EMBEDDINGS,
}
# The routes that show the gateway's internals (replica endpoints, choices): not a
# client's to read.
ADMIN = frozenset({"/metrics", "/routing"})
# The model label of a request whose model did not resolve: a name a client made up
# must not become a metric series.
UNRESOLVED = "-"


# Before the first answer of the control plane the gateway knows no token: a request
# is told to come back (503, Retry-After), never that its key is wrong.
def _not_synced() -> Refusal:
    return Refusal(
        503,
        "the gateway is starting: it has no routing table or tokens yet (the control plane "
        "has not answered); retry shortly",
        code="gateway_starting",
        type="service_unavailable",
        retry_after=1,
    )


class ClientGone(Exception):
    """The client went away while its body was being read."""


class GatewayApp:
    def __init__(
        self,
        state: State,
        proxy: Proxy,
        settings: GatewaySettings,
        lifespan: Callable[[], Awaitable[None]] | None = None,
        shutdown: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.state = state
        self.proxy = proxy
        self.settings = settings
        self._startup = lifespan
        self._shutdown = shutdown
        # Request ids: 16 hex digits, 8 random per process (and per worker) and a count.
        # uuid4 per request was 5% of the CPU of a request (py-spy); ids only need to be
        # unique, not unguessable (they name a log line, not a capability).
        self._id_prefix = os.urandom(4).hex()
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self._startup is not None:
                    await self._startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._shutdown is not None:
                    await self._shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def new_request_id(self) -> str:
        """A new id for an answer: this process's random prefix and a counter."""
        return f"{self._id_prefix}{next(self._ids) & 0xFFFFFFFF:08x}"

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        kind = INFERENCE.get(path)
        if kind is not None and method == "POST":
            await self._inference(scope, receive, send, kind)
            return
        # Every answer carries an x-request-id (the docs promise it), a refusal's and a
        # health check's too: a client quoting it finds the answer in the logs.
        rid = self.new_request_id().encode()
        if kind is not None:
            await _error(send, Refusal(405, f"{path} takes POST", code="method_not_allowed"), rid)
            return
        if method not in ("GET", "HEAD"):
            await _error(send, Refusal(405, f"{path} takes GET", code="method_not_allowed"), rid)
            return
        now = time.monotonic()
        if path == "/healthz":
            health = self.state.health(now)
            ready = self.state.synced
            status = "ok" if self.state.reachable else "degraded" if ready else "starting"
            body = {
                "status": status,
                "detail": None
                if status == "ok"
                else "serving from the last known routing table: the control plane is unreachable"
                if ready
                else "no routing table yet: the control plane has not answered",
                "control_plane": health,
                "models": len(self.state.table.models),
                "ready_replicas": sum(len(r) for r in self.state.table.ready.values()),
            }
            await _json(send, 200 if ready else 503, body, rid)
        elif path in ADMIN and not self.settings.admin_open and (denied := self._reader(scope)):
            await _error(send, denied, rid)
        elif path == "/metrics":
            m = self.state.metrics
            m.control_plane_up.set(1 if self.state.reachable else 0)
            if self.state.synced:
                m.table_age.set(now - self.state.last_sync)
            data = generate_latest(m.registry)
            await _raw(send, 200, data, CONTENT_TYPE_LATEST, rid)
        elif path == "/routing":
            await _json(send, 200, self.state.routing(now), rid)
        elif path == "/v1/models" or path.startswith("/v1/models/"):
            await self._models(scope, send, path, rid)
        else:
            await _error(
                send,
                Refusal(
                    404,
                    f"no route {path[:100]!r}; the gateway serves /v1/chat/completions, "
                    "/v1/completions, /v1/embeddings, /v1/models",
                    code="not_found",
                ),
                rid,
            )

    def _reader(self, scope: Scope) -> Refusal | None:
        """Why this request may not read ``/metrics`` or ``/routing``; None if it may.

        They show every replica's endpoint, the set-aside ones and why choices were
        made: a cluster's operator or reader token reads them, as the control plane's
        own ``/metrics``; a client token does not."""
        if not self.state.synced:
            return _not_synced()
        header = _header(scope, b"authorization")
        scheme, _, token = (header or b"").decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Refusal(
                401,
                "/metrics and /routing take an operator or reader token of the cluster "
                "(`Authorization: Bearer ...`; `llmgw token new NAME --role reader`), or "
                "[gateway] admin_open = true where only a private network reaches the port",
                code="invalid_api_key",
                type="authentication_error",
            )
        digest = hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()
        if digest in self.state.readers:
            return None
        if digest in self.state.clients:
            return Refusal(
                403,
                "a client token may not read /metrics or /routing; use an operator or "
                "reader token of the cluster",
                code="forbidden",
                type="permission_error",
            )
        return Refusal(
            401,
            "the token is not an operator or reader token of this cluster (revoked, "
            "mistyped, or of another role)",
            code="invalid_api_key",
            type="authentication_error",
        )

    def _client(self, scope: Scope) -> Client:
        header = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                header = value
                break
        if header is None:
            raise Refusal(
                401,
                "no API key: send `Authorization: Bearer <client token>` (`llmgw token new "
                "NAME --role client`)",
                code="invalid_api_key",
                type="authentication_error",
            )
        if not self.state.synced:
            # The tokens come with the first table: a valid key must not be told it is
            # invalid by a gateway that has not heard from the control plane yet.
            raise _not_synced()
        scheme, _, token = header.decode("latin-1").partition(" ")
        client = None
        if scheme.lower() == "bearer" and token.strip():
            digest = hashlib.sha256(token.strip().encode("utf-8", "replace")).hexdigest()
            client = self.state.clients.get(digest)
        if client is None:
            raise Refusal(
                401,
                "the API key is not a client token of this cluster (revoked, mistyped, or "
                "not a client token)",
                code="invalid_api_key",
                type="authentication_error",
            )
        return client

    async def _models(self, scope: Scope, send: Send, path: str, rid: bytes) -> None:
        try:
            client = self._client(scope)
        except Refusal as refusal:
            await _error(send, refusal, rid)
            return
        allowed = self.state.allowed(client)
        table = self.state.table
        if path == "/v1/models":
            data = [
                m.openai() for name, m in table.models.items() if allowed is None or name in allowed
            ]
            await _json(send, 200, {"object": "list", "data": data}, rid)
            return
        wanted = path[len("/v1/models/") :]
        try:
            entry = admission.resolve(table, wanted[: admission.MAX_MODEL_NAME + 1], allowed)
        except Refusal as refusal:
            await _error(send, refusal, rid)
            return
        await _json(send, 200, entry.openai(), rid)

    def _current_task(self) -> asyncio.Task[Any] | None:
        # current_task() with no loop finds the running one, and CPython checks that
        # one's process id by a getpid() system call each time: 1.3% of the gateway's
        # CPU at 64 streams (py-spy). The loop is looked up once (again if it changed).
        loop = self._loop
        if loop is None or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
        return asyncio.current_task(loop)

    async def _inference(self, scope: Scope, receive: Receive, send: Send, kind: str) -> None:
        state = self.state
        trace = Trace(self.new_request_id(), "-", time.monotonic())
        label = UNRESOLVED
        asked = ""
        req: admission.Request | None = None
        unwatch: Callable[[], object] | None = None
        gone = _Gone(self._current_task())
        started = False
        try:
            client = self._client(scope)
            trace.client, trace.limits = client.name, client.limits
            raw = await _read(receive, self.settings.max_body_bytes)
            body, req = await _parse(raw, kind)
            asked = req.model
            session = _header(scope, b"x-session-id")
            if session:
                req = _with_session(req, session)
            entry = admission.resolve(state.table, req.model, state.allowed(client))
            label = entry.name
            started = True
            state.metrics.model(label).inflight.inc()
            state.windows.started(label, trace.started)
            call = _call(
                scope,
                req=req,
                body=body,
                raw=raw,
                allowed=state.allowed(client),
                client=client,
                send=send,
                trace=trace,
            )
            # A client that goes away cancels its request, upstream included.
            unwatch = _watch_client(call.hooks, receive, gone)
            await self.proxy.serve(call, entry)
        except Refusal as refusal:
            trace.outcome = "unavailable" if refusal.status == 503 else "refused"
            if refusal.status != 503:
                state.metrics.refusals.labels(label, refusal.reason).inc()
            trace.status = refusal.status
            if not trace.bytes_sent:
                await _error(send, refusal, trace.request_id.encode(), self._limited(trace, label))
        except asyncio.CancelledError:
            if not gone.happened:
                raise
            trace.outcome = "ok" if trace.complete else "cancelled"
        except ClientGone:
            trace.outcome = "cancelled"
        except Exception:
            trace.outcome = "failed"
            log.exception("gateway.request_failed", request_id=trace.request_id)
            if not trace.bytes_sent:
                await _error(
                    send,
                    Refusal(500, "the gateway failed; see its log", type="server_error"),
                    trace.request_id.encode(),
                )
        finally:
            if unwatch is not None:
                unwatch()
            self._account(trace, kind, label, asked, req, started=started)

    def _limited(self, trace: Trace, model: str) -> list[tuple[bytes, bytes]]:
        """A limited token's x-ratelimit-* headers: every answer of it says where it
        stands (OpenAI's), its refusals included; none for another."""
        if trace.limits is NO_LIMITS:
            return []
        return self.state.quotas.headers(trace.client, trace.limits, model, time.monotonic())

    def _account(
        self,
        trace: Trace,
        kind: str,
        label: str,
        asked: str,
        req: admission.Request | None,
        *,
        started: bool,
    ) -> None:
        """A finished request in the metrics, the signal windows and its log line."""
        state = self.state
        now = time.monotonic()
        if started:
            state.metrics.model(label).inflight.dec()
            state.windows.finished(label, now, error=trace.outcome in ("failed", "unavailable"))
            if trace.ttft_s is not None and trace.served is not None:
                served = state.metrics.model(trace.served)
                served.ttft.observe(trace.ttft_s)
                if trace.tpot_s is not None:
                    served.tpot.observe(trace.tpot_s)
                # The autoscaler holds a window's TTFT p99 against slo.ttft_p99: only a
                # stream's first token is a time to first token. A whole answer's latency
                # is its last token's, and would read as a breach for any long answer.
                streamed = req is not None and req.stream
                ttft = trace.ttft_s if streamed else None
                state.windows.timing(trace.served, now, ttft, trace.tpot_s)
            if trace.served is not None and trace.served != label:
                state.metrics.fallbacks.labels(label, trace.served).inc()
            used = trace.usage
            if used is not None and trace.served is not None:
                state.metrics.used(
                    trace.client, trace.served, used.prompt, used.cached, used.completion
                )
            _ledger(state, trace, label)
        state.metrics.request(label, trace.outcome).inc()
        log.info(
            "gateway.request",
            request_id=trace.request_id,
            client=trace.client,
            kind=kind,
            model_asked=asked[:128],
            model_served=trace.served,
            replica=trace.replica,
            status=trace.status,
            outcome=trace.outcome,
            stream=req.stream if req is not None else None,
            attempts=trace.attempts,
            tried=trace.tried or None,
            prompt_tokens=trace.prompt_tokens,
            completion_tokens=trace.completion_tokens,
            cached_tokens=None if trace.usage is None else trace.usage.cached,
            latency_ms=round((now - trace.started) * 1e3, 3),
            ttft_ms=None if trace.ttft_s is None else round(trace.ttft_s * 1e3, 3),
            waited_ms=round(trace.waited_s * 1e3, 1) if trace.waited_s else None,
            priority=trace.priority_class,
            queued_ms=round(trace.queued_s * 1e3, 1) if trace.queued_s else None,
        )


def _ledger(state: State, trace: Trace, model: str) -> None:
    """A finished request in the usage ledger (gateway.stages.ledger): the engine's own
    counts when it gave them; else, when something was sent, the gateway's (estimated);
    else none used."""
    used = trace.usage
    tokens: tuple[int, int, int] | None
    if used is not None:
        tokens, estimated = (used.prompt, used.cached, used.completion), False
    elif trace.bytes_sent and trace.served is not None:
        tokens = (trace.prompt_tokens or 0, 0, trace.completion_tokens or 0)
        estimated = True
    else:
        tokens, estimated = None, False
    state.ledger.record(
        trace.client,
        model,
        trace.served,
        trace.replica,
        trace.outcome,
        tokens=tokens,
        estimated=estimated,
        now=time.time(),
    )


# The OpenAI SDKs send their read timeout (seconds) in this header: how long the client
# waits for an answer. A request waits in a full model's queue no longer than that (nor
# than [gateway] queue_max_wait): a client that gave up must not hold a place.
TIMEOUT_HEADER = b"x-stainless-read-timeout"
PRIORITY_HEADER = b"x-llmgw-priority-class"


def _call(
    scope: Scope,
    *,
    req: admission.Request,
    body: Any,
    raw: bytes,
    allowed: frozenset[str] | None,
    client: Client,
    send: Send,
    trace: Trace,
) -> Call:
    """The proxy's view of one admitted request; its class is its token's, or lower."""
    trace.priority_class = lowered(client.priority_class, _priority_header(scope))
    return Call(
        req,
        body,
        raw,
        allowed,
        send,
        trace,
        hooks_of(scope),
        share=client.share,
        queue_wait_s=_client_timeout(scope),
    )


def _client_timeout(scope: Scope) -> float | None:
    raw = _header(scope, TIMEOUT_HEADER)
    if raw is None or len(raw) > 16:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if 0 < value < 1e9 else None


def _priority_header(scope: Scope) -> str | None:
    raw = _header(scope, PRIORITY_HEADER)
    if raw is None or len(raw) > 16:
        return None
    text = raw.decode("latin-1").strip().lower()
    return text if text in RANK else None


def _with_session(req: admission.Request, session: bytes) -> admission.Request:
    from dataclasses import replace

    return replace(req, session=session[:256].decode("latin-1"))


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            found: bytes = value
            return found
    return None


_NO_EXTENSIONS: dict[str, Any] = {}


class _Gone:
    """The client of one request went away: its task is cancelled, upstream included."""

    __slots__ = ("happened", "task")

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.task = task
        self.happened = False

    def __call__(self) -> None:
        self.happened = True
        if self.task is not None:
            self.task.cancel()


def _watch_client(
    hooks: RequestHooks | None, receive: Receive, gone: _Gone
) -> Callable[[], object]:
    """Have ``gone`` called if the client goes away: told by the server's protocol
    (httpguard's ``RequestHooks``) when it can, else by a task of its own. Returns
    what stops the watch."""
    if hooks is not None:
        hooks.on_disconnect(gone)
        return functools.partial(hooks.on_disconnect, None)
    return asyncio.create_task(_watch(receive, gone)).cancel


def hooks_of(scope: Scope) -> RequestHooks | None:
    """The request's hooks when the server is httpguard's protocol (else None)."""
    hooks: RequestHooks | None = (scope.get("extensions") or _NO_EXTENSIONS).get(HOOKS)
    return hooks


async def _watch(receive: Receive, gone: _Gone) -> None:
    """Wait for the client to go away; then cancel its request (a server without
    httpguard's hooks)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone()
            return


async def _read(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Refusal(
                413,
                f"the body is over {limit} bytes; the gateway reads at most that "
                "([gateway] max_body_bytes)",
                code="request_too_large",
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


_decode = msgspec.json.Decoder().decode
# What msgspec refuses that json.loads may still take (NaN, a lone surrogate escape, a
# BOM, UTF-16) or refuses in words of its own: json.loads has the last word, so a body
# is accepted, and a refusal worded, exactly as before.
_NOT_MSGSPEC = (msgspec.DecodeError, RecursionError)


class _Huge:
    """An integer literal too long to convert (``admission.MAX_INT_DIGITS``): kept as
    its length, and refused by ``_pairs`` naming the field it is in."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _int(text: str) -> int | _Huge:
    digits = len(text) - text.startswith("-")
    if digits > admission.MAX_INT_DIGITS:
        return _Huge(digits)
    return int(text)


def _huge_in(value: Any) -> _Huge | None:
    """A too-long integer in ``value`` itself or in its lists (an object's own are
    found by its own ``_pairs``)."""
    if isinstance(value, _Huge):
        return value
    if isinstance(value, list):
        for item in value:
            if isinstance(item, _Huge | list) and (found := _huge_in(item)) is not None:
                return found
    return None


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    for key, value in pairs:
        huge = _huge_in(value)
        if huge is not None:
            raise Refusal(
                400,
                f"`{key[:64]}` holds an integer of {huge.digits} digits; an integer in a "
                f"request has at most {admission.MAX_INT_DIGITS}",
                param=key[:64],
                code="invalid_value",
            )
    return dict(pairs)


def _loads(raw: bytes) -> Any:
    # msgspec first: 1.1 us for a small chat body against json.loads' 2.9 us, the same
    # objects whenever it succeeds (checked by tests/unit/gateway/test_body_decode.py).
    try:
        return _decode(raw)
    except _NOT_MSGSPEC:
        pass
    try:
        # An integer too long for int() names its field, not Python's limit (whose
        # words told the client to call ``sys.set_int_max_str_digits``).
        value = json.loads(raw, parse_int=_int, object_pairs_hook=_pairs)
    except UnicodeDecodeError as exc:
        raise Refusal(400, f"the body is not UTF-8 ({exc.reason})", code="invalid_body") from None
    except RecursionError:
        raise Refusal(
            400, f"the body is nested too deep (at most {admission.MAX_DEPTH})", code="invalid_body"
        ) from None
    except ValueError as exc:
        raise Refusal(400, f"the body is not JSON: {exc}"[:200], code="invalid_body") from None
    if _huge_in(value) is not None:  # (a list, or the integer itself, as the whole body)
        raise Refusal(400, "the body must be a JSON object", code="invalid_body")
    return value


def _decoded(raw: bytes, kind: str) -> tuple[Any, admission.Request]:
    body = _loads(raw)
    return body, admission.parse_request(body, kind, raw)


async def _parse(raw: bytes, kind: str) -> tuple[Any, admission.Request]:
    """The body decoded and its facts read (``admission.parse_request``); a large one
    in a worker thread. Reading it walks the body (its depth, every message): an 8 MiB
    body of 2.7 million empty objects held the event loop 2.7 s when only the decoding
    was off it, and every other client, /healthz and a stop waited on it."""
    if not raw:
        raise Refusal(400, "the body is empty; send a JSON object", code="invalid_body")
    if len(raw) > INLINE_JSON:
        return await asyncio.to_thread(_decoded, raw, kind)
    return _decoded(raw, kind)


async def _raw(
    send: Send, status: int, body: bytes, content_type: str, rid: bytes, *, extra: Any = ()
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"x-request-id", rid),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _json(send: Send, status: int, value: Any, rid: bytes, *, extra: Any = ()) -> None:
    body = json.dumps(value, separators=(",", ":")).encode()
    await _raw(send, status, body, "application/json", rid, extra=extra)


async def _error(send: Send, refusal: Refusal, rid: bytes, more: Any = ()) -> None:
    extra: list[tuple[bytes, bytes]] = [*more]
    if refusal.retry_after is not None:
        extra.append((b"retry-after", str(refusal.retry_after).encode()))
    if refusal.status == 401:
        extra.append((b"www-authenticate", b"Bearer"))
    await _json(send, refusal.status, refusal.body(), rid, extra=extra)
