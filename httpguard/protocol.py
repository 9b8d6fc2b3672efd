"""uvicorn's httptools protocol with the head bounded, in size, count and time.

httptools (llhttp) reports a header to Python only once it is complete, and
until then appends each piece to the bytes it holds, so the size is checked on
the raw bytes received while a head is incomplete: a connection never makes the
server hold more than ``max_header_bytes`` plus one read (asyncio reads at most
256 KiB at a time) before it is answered 431 and closed. The count and the
exact size of a head that completes within one read are checked in the parser's
callbacks, before the application sees the request.

A request's body, once its head is in, must arrive within ``body_timeout_s`` and,
after its first ``header_timeout_s``, at ``body_min_rate`` bytes a second on
average (one timer, armed only for a body that did not arrive with its head); else
408 and the connection is closed. An answer given before the request's body is in
(401, 403, 413: the application did not want it) says ``connection: close`` and the
connection closes once the answer is out (a lingering close, as after a refusal of
ours): it is never held open to read a body nobody will use.

A connection holds at most ``MAX_PIPELINED`` requests queued behind the one being
served (HTTP/1.1 pipelining: sent before their answers were read). The server reads no
more from it until the queue is empty (uvicorn read again after every answer, so a
client that never read its answers had 20,000 queued); a request beyond the bound
stops the reading for good: the queued ones are answered, the last with
``connection: close``, and the connection closes (``http.pipeline_full``).

The connection cap is shared by every client, so what fills it must give way: when
``max_connections`` are open, a new connection takes the place of the oldest one
with no request being served (``_room_key``): first those that do not read their
answers (the server's writes to it paused: more than the transport's high-water mark
waits for the client) or have a request queued behind the one being served (a client
that asks before it reads is not being served, it is being written at), then
those answered and closing, then
those that sent part of a head, then those that sent nothing yet (a real client's head
comes with its first packet, so the newest of them is the likeliest to be one), then
idle keep-alive ones, then those still sending a body. A connection whose request's head
and body are in is
never closed to make room; only when every connection holds one is the new one
answered 503. Why not a cap per client address: behind a load balancer or a NAT
every client has one address, and an attacker with an IPv6 prefix has millions.

The refusals are logged, at most one line per kind every ``LOG_EVERY_S``
seconds with the number since the last one: a client opening connections must
not also get to write the log. So is a connection lost with pipelined requests in it
(``http.pipeline_dropped``): what the application still sends for them is dropped, as
for any client gone, never written to the closed transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from httpguard.limits import HeadLimits


def _log() -> Any:
    """The refusals' logger, made when one is first logged: importing structlog cost ~45 ms
    of CPU in every server started (a sim engine's whole start is ~0.25 s; a cluster starts
    one per replica), and most never refuse anything."""
    import structlog

    return structlog.get_logger("llmgw.http")


LOG_EVERY_S = 10.0
# After a refusal, what the client still sends is read and dropped for this long (or
# this much) before the connection closes: closing with unread data would reset it,
# and the client would lose the answer that says what was wrong (nginx's lingering
# close does the same).
LINGER_S = 2.0
LINGER_MAX_BYTES = 4 << 20
# How many of the oldest reclaimable connections one look over every connection keeps,
# to make room for as many new ones without looking again (``_make_room``).
ROOM_BATCH = 64
# Requests a connection may have queued behind the one being served (pipelined); one
# more stops the reading, and the connection closes once the queued ones are answered.
# Browsers and HTTP client libraries do not pipeline; a client that does gets its
# answers and a ``connection: close`` to open another connection on.
MAX_PIPELINED = 16
# The kinds of connection that give way to a new one when the cap is full, first to last
# (``_room_key``): not reading its answers (or asking before reading them); answered and
# closing; part of a head sent; nothing sent yet; idle between requests; a body still
# arriving.
_UNREAD, _CLOSING, _PARTIAL, _SILENT, _IDLE, _SENDING_BODY = range(6)
_KINDS = ("unread", "closing", "partial_head", "silent", "idle", "sending_body")


class _HeadTooLarge(Exception):
    """Raised in a parser callback: llhttp stops, ``feed_data`` raises, the head is refused."""


class _PipelineFull(Exception):
    """Raised in a parser callback: a request beyond ``MAX_PIPELINED`` queued is not taken."""


class _Throttled:
    """One log line per ``every`` seconds for one kind of refusal, with the count between."""

    def __init__(self, event: str, every: float = LOG_EVERY_S) -> None:
        self.event = event
        self.every = every
        self.last = -every
        self.count = 0

    def __call__(self, **fields: Any) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= self.every:
            _log().warning(self.event, refused=self.count, **fields)
            self.last, self.count = now, 0


def _answer(status: bytes, message: str) -> bytes:
    body = message.encode("ascii", "replace")
    return b"".join(
        [
            b"HTTP/1.1 ",
            status,
            b"\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: ",
            str(len(body)).encode(),
            b"\r\nconnection: close\r\n\r\n",
            body,
        ]
    )


class CoalescedTransport:
    """A transport whose writes within one turn of the event loop go out as one.

    uvicorn writes a response's head and its body apart (two ``write`` calls for any
    answer), and uvloop sends each at once: two system calls where one would do. A
    profile of the gateway under load put a quarter of its CPU in those writes. Here
    the writes of a turn are joined and sent at the end of it (``call_soon``), so an
    answer written whole is one system call, and a stream's pieces written together
    go together; nothing waits longer than the current turn.
    """

    __slots__ = ("_buffer", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._buffer: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._buffer:
            self._loop.call_soon(self.flush)
        self._buffer.append(data)

    def flush(self) -> None:
        """Send what this turn wrote so far (run at the turn's end; called earlier by a
        server with nothing more to join, ``flush_alone``)."""
        if not self._buffer:
            return
        data = b"".join(self._buffer)
        self._buffer.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._buffer))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _CloseUnread:
    """The transport a request's cycle writes to while its body is still arriving:
    uvicorn closes the connection after an answer given then (``keep_alive`` off), and
    this makes that close a lingering one (``_close_unread``): closing a socket with
    unread bytes resets it, and the client, still sending, would lose the answer."""

    __slots__ = ("_protocol",)

    def __init__(self, protocol: Any) -> None:
        self._protocol = protocol

    def close(self) -> None:
        self._protocol._close_unread()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._protocol.transport, name)


# The ASGI scope extension (``scope["extensions"][HOOKS]``, a ``RequestHooks``) by which
# an application of the guarded protocol learns that its client went away, and writes a
# streamed body's pieces without going through ``send``.
HOOKS = "llmgw.hooks"


class RequestHooks:
    """One request's ``HOOKS`` extension.

    ``on_disconnect(callback)`` registers the one callback (``None`` clears it), called
    once, from the protocol's ``connection_lost``, if the connection is lost before the
    request's response is complete. Why: the ASGI way to notice a client gone is a task
    awaiting ``receive()`` for ``http.disconnect`` beside the request's own; made, woken
    and cancelled for every request, it was 4-5% of the gateway's CPU per request
    (py-spy). A callback on the connection costs one small object.

    ``write_body(data)``: a piece of a chunked response body (started, not complete,
    ``send`` never told its length), written as ``send({"type": "http.response.body",
    "body": data, "more_body": True})`` would write it, from a plain function, so it can
    be called from another connection's read callback (the gateway's engine side) with
    no task woken per piece. False, and nothing written, when it must go through
    ``send`` instead: the client is gone or not reading (``send`` waits for it), the
    response is not a chunked one in progress, or the server is not one this knows.
    """

    __slots__ = ("_callback", "_protocol")

    def __init__(self, protocol: Any) -> None:
        self._callback: Callable[[], object] | None = None
        # The connection's protocol, not the request's cycle: the scope holds these
        # hooks and the cycle holds the scope, so a reference to the cycle made every
        # request a reference cycle, freed only by the garbage collector (90,000
        # objects a gen-1 collection over 16,000 requests, against 354 without).
        self._protocol = protocol

    def on_disconnect(self, callback: Callable[[], object] | None) -> None:
        self._callback = callback

    def write_body(self, data: bytes) -> bool:
        protocol = self._protocol
        # Only the newest request's (a pipelined request behind it goes through send).
        cycle = protocol.cycle if protocol._hooks is self else None
        if (
            cycle is None
            or cycle.disconnected
            or cycle.flow.write_paused
            or not cycle.response_started
            or cycle.response_complete
            or cycle.chunked_encoding is not True
        ):
            return False
        if data:
            cycle.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        return True

    async def start(
        self, send: Callable[[Any], Awaitable[None]], message: dict[str, Any], head: bytes
    ) -> None:
        """``send(message)``, an ``http.response.start``, with ``head`` written after
        the headers the message names: header lines (``name: value\\r\\n`` each) the
        application made of its own constants, names and numbers. uvicorn checks every
        header of a message by two regular expressions, about 6,500 instructions a
        header under callgrind (a limited client's answer carried ten of the gateway's
        own: a tenth of the request); lines the application vouches for are not checked
        again. Where they cannot be written so (not the newest request, its answer
        started, the client gone or not reading: ``send`` would wait) they go into the
        message's headers and are checked as any."""
        if head and not _whole_lines(head):
            raise ValueError(f"not whole header lines: {head[:200]!r}")
        protocol = self._protocol
        cycle = protocol.cycle if protocol._hooks is self else None
        if (
            not head
            or cycle is None
            or cycle.disconnected
            or cycle.flow.write_paused
            or cycle.response_started
        ):
            if head:
                message["headers"] = [*message.get("headers", ()), *head_pairs(head)]
            await send(message)
            return
        transport = cycle.transport
        cycle.transport = _HeadSplice(transport, head)
        try:
            # No await on this path (the write is not paused): the head is written
            # before anything else can use the cycle's transport.
            await send(message)
        finally:
            cycle.transport = transport

    def flush(self) -> None:
        """What ``write_body`` wrote, sent now rather than at the turn's end when that
        is worth it (the protocol's ``flush_alone``). Never raises: it runs in another
        connection's read callback."""
        with contextlib.suppress(Exception):
            self._protocol.flush_alone()

    def _fire(self) -> None:
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()


class _HeadSplice:
    """A cycle's transport while its response's head is written (``RequestHooks.start``):
    the application's own header lines go in before the blank line that ends it."""

    __slots__ = ("_head", "_transport")

    def __init__(self, transport: Any, head: bytes) -> None:
        self._transport = transport
        self._head = head

    def write(self, data: bytes) -> None:
        head, self._head = self._head, b""
        if head and data.endswith(b"\r\n\r\n"):
            data = data[:-2] + head + b"\r\n"
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _whole_lines(head: bytes) -> bool:
    """Whether ``head`` is header lines that cannot end the head early: each ends with
    CRLF, none is empty, no CR or LF stands alone. A guard, not uvicorn's check (a few
    ``count``s in C, where that is two regular expressions a header): lines that fail it
    are refused (``ValueError``, nothing written), so a value the application did not
    mean to make can never split an answer or start another."""
    crlf = head.count(b"\r\n")
    return (
        head.endswith(b"\r\n")
        and head.count(b"\r") == crlf
        and head.count(b"\n") == crlf
        and b"\r\n\r\n" not in head
        and not head.startswith(b"\r\n")
    )


def head_pairs(head: bytes) -> list[tuple[bytes, bytes]]:
    """Header lines (``name: value\\r\\n`` each) as ASGI's (name, value) pairs."""
    out = []
    for line in head.split(b"\r\n")[:-1]:
        name, _, value = line.partition(b": ")
        out.append((name, value))
    return out


def _stamp(answer: bytes, request_id: str) -> bytes:
    """``answer`` with an ``x-request-id`` header after its status line."""
    status_end = answer.index(b"\r\n") + 2
    rid = request_id.encode("ascii", "replace")
    return answer[:status_end] + b"x-request-id: " + rid + b"\r\n" + answer[status_end:]


def guarded_protocol(
    limits: HeadLimits,
    *,
    coalesce_writes: bool = False,
    request_id: Callable[[], str] | None = None,
) -> type[HttpToolsProtocol]:
    """An ``HttpToolsProtocol`` subclass enforcing ``limits`` (give it as uvicorn's ``http``).

    ``coalesce_writes``: a response's writes within one loop turn go out as one system
    call (``CoalescedTransport``), for a server whose answers are its hot path.
    ``request_id``: the server's own request ids; given, the answers this protocol gives
    on its own (408, 431, 503) carry one in ``x-request-id``, as the application's do,
    and the refusal's log line names the last one (the gateway promises an id on every
    answer, so a client quoting one finds it)."""
    too_large = _Throttled("http.head_too_large")
    too_slow = _Throttled("http.head_timeout")
    too_many = _Throttled("http.connections_full")
    not_reading = _Throttled("http.write_timeout")
    body_slow = _Throttled("http.body_timeout")
    reclaimed = _Throttled("http.connection_reclaimed")
    pipeline_full = _Throttled("http.pipeline_full")
    pipeline_dropped = _Throttled("http.pipeline_dropped")

    def stamped(answer: bytes) -> tuple[bytes, dict[str, str]]:
        """The answer to send, and the field naming its id for the log line."""
        if request_id is None:
            return answer, {}
        rid = request_id()
        return _stamp(answer, rid), {"request_id": rid}

    max_bytes, max_headers = limits.max_header_bytes, limits.max_headers
    large = _answer(
        b"431 Request Header Fields Too Large",
        f"the request's head is larger than {max_bytes} bytes or has more than "
        f"{max_headers} header lines; send fewer or smaller headers\n",
    )
    slow = _answer(
        b"408 Request Timeout",
        f"the request line and headers did not arrive within {limits.header_timeout_s:g}s\n",
    )
    full = _answer(
        b"503 Service Unavailable",
        f"this server already holds {limits.max_connections} connections, its limit; "
        "retry shortly, or reuse a connection\n",
    )
    body_late = _answer(
        b"408 Request Timeout",
        f"the request's body did not arrive within {limits.body_timeout_s:g}s, or at "
        f"{limits.body_min_rate} bytes a second after its first {limits.header_timeout_s:g}s\n",
    )
    # Connections closed to make room whose ``connection_lost`` has not come yet: still
    # in uvicorn's set of connections, but their place is taken.
    leaving: set[Any] = set()
    # The oldest connections of the kind that gave way last, from the last look over
    # all of them, oldest last: ``(key, connection)`` (``_make_room``).
    oldest_first: list[tuple[tuple[int, float, int], Any]] = []
    # Connections in the order they were made: the loop's clock is the same for every
    # connection accepted in one turn, and the first of them is the oldest.
    serials = itertools.count()

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        # Bytes received since the head began, while it is incomplete.
        _head_raw = 0
        # The head as the parser handed it over: its size and header lines.
        _head_size = 0
        _head_count = 0
        _in_head = True
        _head_timer: asyncio.TimerHandle | None = None
        # Set once the connection is refused: what arrives is dropped until it closes.
        _lingering: asyncio.TimerHandle | None = None
        _dropped = 0
        # Armed while the transport's buffer is over its high-water mark (the client is
        # not reading what it was sent).
        _write_timer: asyncio.TimerHandle | None = None
        # The newest request's hooks (uvicorn's own disconnect, too, reaches only its
        # newest request, ``self.cycle``).
        _hooks: RequestHooks | None = None
        # The keep-alive timeout: since when the connection has been idle (None: a
        # request is in progress), and the one timer that checks it.
        _idle_since: float | None = None
        _idle_timer: asyncio.TimerHandle | None = None
        # Since when no request has been served on it (connected, or its last answer
        # complete): the age by which the oldest gives way to a new connection.
        _free_since = 0.0
        _serial = 0
        # Between a request's head and the end of its body: the body's bytes since
        # ``_body_since`` (when its timer was armed), the timer, and whether the
        # connection may be kept alive once the body is in (uvicorn's ``keep_alive``,
        # held off until then).
        _body_pending = False
        _body_since = 0.0
        _body_bytes = 0
        _body_timer: asyncio.TimerHandle | None = None
        _keep_alive = True
        _unread: _CloseUnread | None = None
        # With requests pipelined: the one being served (uvicorn's ``self.cycle`` is the
        # newest queued), told the client is gone when the connection is lost.
        _serving: Any = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if coalesce_writes:
                transport = cast(asyncio.Transport, CoalescedTransport(transport, self.loop))
            super().connection_made(transport)
            self._free_since = self.loop.time()
            self._serial = next(serials)
            self._unread = _CloseUnread(self)
            full_now = len(self.connections) - len(leaving) > limits.max_connections
            if full_now and not self._make_room():
                answer, named = stamped(full)
                too_many(limit=limits.max_connections, **named)
                self._refuse(answer)
                return
            # Covers a client that connects and sends nothing at all.
            self._arm_head_timer()

        def _room_key(self) -> tuple[int, float, int] | None:
            """Which kind of connection this is, and since when, if it may give way to
            a new one (None: its request is being served)."""
            if self.flow.write_paused or self.pipeline:
                kind = _UNREAD
            elif self._lingering is not None:
                kind = _CLOSING
            elif self._in_head and self._head_raw:
                kind = _PARTIAL
            elif self.cycle is None:
                kind = _SILENT
            elif self.cycle.response_complete:
                kind = _IDLE
            elif self._body_pending:
                return _SENDING_BODY, self._body_since, self._serial
            else:
                return None
            return kind, self._free_since, self._serial

        def _make_room(self) -> bool:
            """Close the connection that gives way to this new one (False: none may)."""
            while oldest_first:
                key, victim = oldest_first.pop()
                if self._may_close(victim) and victim._room_key() == key:
                    self._close_for_room(victim, key)
                    return True
            found: list[tuple[tuple[int, float, int], Any]] = []
            for other in self.connections:
                if other in leaving:
                    continue
                if other.transport.is_closing():
                    # Closed already, gone at the loop's next turn: its place is free.
                    leaving.add(other)
                # (A connection upgraded to a WebSocket is another protocol's: it stays.)
                elif isinstance(other, GuardedHttpToolsProtocol) and other is not self:
                    room = other._room_key()
                    if room is not None:
                        found.append((room, other))
            if len(self.connections) - len(leaving) <= limits.max_connections:
                return True
            if not found:
                return False
            oldest = heapq.nsmallest(ROOM_BATCH, found, key=_first)
            key, victim = oldest[0]
            self._close_for_room(victim, key)
            if key[0] <= _PARTIAL:
                # The next ones of the same kind, kept for the next new connections: a
                # connection opened since is newer than each of them, and one that
                # starts closing since empties the list (``_linger``). Never the later
                # kinds: a connection sends part of a head at any read.
                oldest_first[:] = [kv for kv in reversed(oldest[1:]) if kv[0][0] == key[0]]
            return True

        def _may_close(self, other: Any) -> bool:
            return (
                other in self.connections
                and other not in leaving
                and not other.transport.is_closing()
            )

        def _close_for_room(self, victim: Any, key: tuple[int, float, int]) -> None:
            leaving.add(victim)
            reclaimed(
                limit=limits.max_connections,
                kind=_KINDS[key[0]],
                client=_client(victim.client),
            )
            if key[0] == _IDLE:
                victim.transport.close()  # nothing unread: a clean close its pool sees
            else:
                victim.transport.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            leaving.discard(self)
            self._disarm_body_timer()
            self._disarm_head_timer()
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None
            if self._lingering is not None:
                self._lingering.cancel()
            hooks, self._hooks = self._hooks, None
            cycle = self.cycle
            gone = hooks is not None and cycle is not None and not cycle.response_complete
            serving, self._serving = self._serving, None
            if serving is not None and not serving.response_complete:
                # uvicorn marks only its newest request gone: the one being served,
                # behind the queue, would write its answer to the closed transport
                # (an exception, and a traceback per connection in the log).
                serving.disconnected = True
                serving.message_event.set()
                pipeline_dropped(queued=len(self.pipeline), client=_client(self.client))
            super().connection_lost(exc)
            if gone and hooks is not None:
                # After uvicorn has marked the request disconnected: what the
                # application sends from now on is dropped, as it would be after an
                # ``http.disconnect``.
                hooks._fire()

        def data_received(self, data: bytes) -> None:
            if self._lingering is not None:
                self._dropped += len(data)
                if self._dropped > LINGER_MAX_BYTES:
                    self.transport.close()
                return
            self._unset_keepalive_if_required()
            if self._in_head:
                self._head_raw += len(data)
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError as exc:
                if isinstance(exc.__context__, _HeadTooLarge):
                    self._refuse_large()
                    return
                if isinstance(exc.__context__, _PipelineFull):
                    # The queued requests are answered, the last closes the connection;
                    # nothing more is read (the parser has stopped): the transport stays
                    # paused, and uvicorn's flow control, told it is not, never resumes it.
                    self.flow.pause_reading()
                    self.flow.read_paused = False
                    pipeline_full(limit=MAX_PIPELINED, client=_client(self.client))
                    return
                # Not ours: uvicorn's own answer (400) to a malformed request.
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
                return
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return
            if self._in_head and self._head_raw:
                if self._head_raw > max_bytes:
                    # A header still arriving: what llhttp holds grows with it.
                    self._refuse_large()
                elif self._head_timer is None:
                    # Armed only for a head that did not arrive whole (a real client's
                    # does, in one write): the common request pays for no timer.
                    self._arm_head_timer()
            elif self._body_pending and self._body_timer is None and self._lingering is None:
                # Likewise only for a body that did not arrive with its head.
                self._body_since = self.loop.time()
                self._body_bytes = 0
                self._body_timer = self.loop.call_at(
                    self._body_since + min(limits.header_timeout_s, limits.body_timeout_s),
                    self._body_check,
                )

        def on_message_begin(self) -> None:
            self._in_head = True
            self._head_size = self._head_count = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._head_size += len(url)
            if self._head_size > max_bytes:
                raise _HeadTooLarge
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._head_count += 1
            self._head_size += len(name) + len(value) + 4  # ": " and CRLF
            if self._head_count > max_headers or self._head_size > max_bytes:
                raise _HeadTooLarge
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._head_raw = 0
            self._disarm_head_timer()
            previous = self.cycle
            if self.pipeline and len(self.pipeline) >= MAX_PIPELINED:
                self._pipeline_full()
            hooks = RequestHooks(self)
            # Before uvicorn starts the application's task with this scope.
            # (uvicorn types an extension's value as a dict; ASGI leaves it to the server.)
            cast(dict[str, Any], self.scope)["extensions"] = {HOOKS: hooks}
            super().on_headers_complete()
            if self.pipeline and len(self.pipeline) == 1 and self._serving is None:
                # The first one queued: the request before it is the one being served.
                self._serving = previous
                if oldest_first and oldest_first[0][0][0] > _UNREAD:
                    oldest_first.clear()  # this one gives way before any of them
            cycle = self.cycle
            if cycle is not None and cycle.scope is self.scope:
                self._hooks = hooks
                # Until the body is in (``_body_done``), an answer closes the
                # connection: ``connection: close``, and a lingering close.
                self._body_pending = True
                self._keep_alive = cycle.keep_alive
                cycle.keep_alive = False
                cycle.transport = self._unread  # type: ignore[assignment]

        def _pipeline_full(self) -> None:
            """Take no more requests: the newest queued one's answer closes the connection."""
            cycle = self.cycle
            if cycle is not None:
                cycle.keep_alive = False
            self._keep_alive = False
            raise _PipelineFull

        def on_body(self, body: bytes) -> None:
            self._body_bytes += len(body)
            super().on_body(body)

        def _body_done(self) -> None:
            self._body_pending = False
            if self._body_timer is not None:
                self._disarm_body_timer()
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                cycle.keep_alive = self._keep_alive
                cycle.transport = self.transport

        def shutdown(self) -> None:
            # uvicorn's stop turns keep-alive off on a request in progress: not to be
            # turned back on when its body completes.
            self._keep_alive = False
            super().shutdown()

        def _close_unread(self) -> None:
            """uvicorn closing after an answer given before the request's body was in."""
            if not self._body_pending or self.transport.is_closing():
                self.transport.close()
                return
            self._disarm_body_timer()
            self._unset_keepalive_if_required()
            self._linger()

        def _body_check(self) -> None:
            self._body_timer = None
            if not self._body_pending or self._lingering is not None:
                return
            if self.transport.is_closing():
                return
            now = self.loop.time()
            cycle = self.cycle
            if self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue):
                # The server is not reading it (the application has not asked for the
                # body yet): that time is not the client's.
                self._body_since, self._body_bytes = now, 0
            since = self._body_since
            due = min(
                since + limits.body_timeout_s,
                since + limits.header_timeout_s + self._body_bytes / limits.body_min_rate,
            )
            if now < due:
                self._body_timer = self.loop.call_at(due, self._body_check)
                return
            late, named = stamped(body_late)
            body_slow(
                timeout_s=limits.body_timeout_s,
                min_rate=limits.body_min_rate,
                client=_client(self.client),
                **named,
            )
            if cycle is None or cycle.response_started or self.pipeline:
                self.transport.abort()
                return
            # The application waits for the body: it is told the client is gone (what
            # it sends from now on is dropped, as after an ``http.disconnect``).
            cycle.disconnected = True
            cycle.message_event.set()
            hooks, self._hooks = self._hooks, None
            if hooks is not None:
                hooks._fire()
            self._refuse(late)

        def _disarm_body_timer(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        # uvicorn arms a keep-alive timer at the end of every response and cancels it
        # at the next request's first byte: a timer made and dropped per request, 3% of
        # the gateway's CPU per request. Here one timer per connection checks when the
        # connection went idle, and is armed again only when it fires on a connection
        # still idle (or when a response ends with none armed). The timeout is the same:
        # an idle connection is closed ``keep_alive_timeout_s`` after its last response.
        def _unset_keepalive_if_required(self) -> None:
            self._idle_since = None

        def on_response_complete(self) -> None:
            # uvicorn's, but for the timer, and the answer sent now (``flush_alone``).
            self.server_state.total_requests += 1
            if self.transport.is_closing() or self._lingering is not None:
                return
            self.flush_alone()
            self._idle_since = None
            if self.pipeline:
                # Reading stays paused until the queue is empty (uvicorn resumed it at
                # every answer: a client that never reads had its queue grow without end).
                cycle, app = self.pipeline.pop()
                self._serving = cycle if self.pipeline else None
                self._start_asgi_task(cycle, app)
                return
            self.flow.resume_reading()
            self._idle_since = self._free_since = now = self.loop.time()
            if self._idle_timer is None:
                self._idle_timer = self.loop.call_at(
                    now + self.timeout_keep_alive, self._idle_check
                )

        def flush_alone(self) -> None:
            """The writes this turn joined so far, sent now rather than at the turn's
            end, when this connection's request is the server's one in flight. Why only
            then: flushing every answer at once cost 15-20% of the requests/s at 64
            clients (a turn's writes leaving together let the clients' next requests
            arrive together), while with one client the turn's end is an extra loop
            pass: 0.27 -> 0.19 ms added p50, 1.25x the requests/s."""
            if coalesce_writes and len(self.tasks) <= 1:
                cast(CoalescedTransport, self.transport).flush()

        def _idle_check(self) -> None:
            self._idle_timer = None
            since = self._idle_since
            if since is None or self.transport.is_closing():
                return  # busy: the response's end arms it again
            due = since + self.timeout_keep_alive
            if due > self.loop.time():
                self._idle_timer = self.loop.call_at(due, self._idle_check)
                return
            self.timeout_keep_alive_handler()

        def on_message_complete(self) -> None:
            # Whatever arrives next on this connection is the next request's head.
            self._in_head = True
            self._head_raw = 0
            if self._body_pending:
                self._body_done()
            super().on_message_complete()

        def pause_writing(self) -> None:
            super().pause_writing()
            if oldest_first and oldest_first[0][0][0] > _UNREAD:
                oldest_first.clear()  # this one gives way before any of them
            if self._write_timer is None:
                self._write_timer = self.loop.call_later(
                    limits.write_timeout_s, self._write_timeout
                )

        def resume_writing(self) -> None:
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None
            super().resume_writing()

        def _write_timeout(self) -> None:
            self._write_timer = None
            not_reading(timeout_s=limits.write_timeout_s, client=_client(self.client))
            # abort, not close: close would wait to send a buffer the client never reads.
            # The application sees the client gone (http.disconnect) and stops.
            self.transport.abort()

        def _arm_head_timer(self) -> None:
            self._head_timer = self.loop.call_later(limits.header_timeout_s, self._head_timeout)

        def _disarm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self._in_head and not self.transport.is_closing():
                # A client that sent nothing gets no answer: nothing was asked.
                answer, named = stamped(slow) if self._head_raw else (b"", {})
                too_slow(timeout_s=limits.header_timeout_s, client=_client(self.client), **named)
                if answer:
                    self.transport.write(answer)
                self.transport.close()

        def _refuse_large(self) -> None:
            if not self.transport.is_closing() and self._lingering is None:
                answer, named = stamped(large)
                too_large(
                    limit_bytes=max_bytes,
                    limit_headers=max_headers,
                    client=_client(self.client),
                    **named,
                )
                self._refuse(answer)

        def _refuse(self, answer: bytes) -> None:
            """Answer, stop sending, and close once the client has had time to read it."""
            self._disarm_head_timer()
            self._disarm_body_timer()
            self._unset_keepalive_if_required()
            self.transport.write(answer)
            self._linger()

        def _linger(self) -> None:
            """Stop sending, drop what arrives, and close once the client has had time
            to read what it was sent (``LINGER_S``, or ``LINGER_MAX_BYTES`` dropped)."""
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self._lingering = self.loop.call_later(LINGER_S, self.transport.close)
            if oldest_first and oldest_first[0][0][0] > _CLOSING:
                oldest_first.clear()  # this one gives way before any of them

    return GuardedHttpToolsProtocol


def _first(item: tuple[tuple[int, float, int], Any]) -> tuple[int, float, int]:
    return item[0]


def _client(addr: tuple[str, int] | None) -> str:
    return "unknown" if addr is None else f"{addr[0]}:{addr[1]}"


def uvicorn_options(
    limits: HeadLimits,
    *,
    coalesce_writes: bool = False,
    request_id: Callable[[], str] | None = None,
) -> dict[str, Any]:
    """The ``uvicorn.Config`` keyword arguments that enforce ``limits``."""
    return {
        "http": guarded_protocol(limits, coalesce_writes=coalesce_writes, request_id=request_id),
        "timeout_keep_alive": limits.keep_alive_timeout_s,
    }
