"""The engines' connections: a pooled HTTP/1.1 keep-alive client on asyncio protocols.

Why not aiohttp's client (which the gateway used first): a profile of the gateway under
load put a quarter of its CPU in aiohttp's request path (its request object, yarl URLs,
multidict headers, tracing hooks, timeouts made per request), for the one thing the
gateway does with it: POST a JSON body to a known engine and read the answer, whole or
streamed. Here that is one ``write`` of a prebuilt head and body, and httptools (the
parser uvicorn uses; llhttp underneath) reads the answer, chunked transfer coding
included, so nothing is parsed by hand. ``python -m bench.gateway`` measures both
(``docs/benchmarks/gateway-side-by-side.md``).

What a caller relies on:

- ``post`` returns once the answer's status and headers are in; its body is read with
  ``read()`` (whole) or ``chunks()`` (as it arrives). ``release()`` gives a complete
  answer's connection back to the pool; ``close()`` closes it (an interrupted answer:
  closing is what stops the engine's work).
- ``Unreachable`` before the first byte of an answer: refused, reset, closed, timed out
  (connect or read), or an answer httptools cannot parse. The caller may retry elsewhere.
  ``BrokenAnswer`` after headers: the body broke off.
- A kept-alive connection the engine closed while idle is detected when taken from the
  pool; one closed in the instant a request was written (nothing of an answer read) is
  tried once more on a new connection, as browsers and Go's client do, because the engine
  never saw that request: uvicorn (vLLM) and llama.cpp close idle connections after 5 s,
  so this race is common. Idle connections are closed here after ``IDLE_S``, sooner.
- Reads are paused when a streamed answer's unread bytes pass ``HIGH_WATER`` (a slow
  client does not make the gateway buffer a fast engine's whole answer).
- A read timeout is the longest wait for the next bytes (aiohttp's ``sock_read``), kept
  with one timer per connection rather than one per read. An engine that trickles bytes
  is not timed out by it (nor was it by aiohttp): the caller's own deadlines bound that.
- Interim answers (100, 103) are skipped; bytes past the answer (a second answer, a body
  longer than its length) close the connection rather than reach this answer or the next.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

# An idle kept-alive connection is closed after this long: engines close theirs after
# 5 s (uvicorn's default, llama.cpp's), and a request on a connection being closed is
# the race this avoids.
IDLE_S = 4.0
# Idle connections kept per engine; more are closed when released.
MAX_IDLE = 256
# Unread bytes of an answer past which reading from the engine pauses.
HIGH_WATER = 256 * 1024
# Parsed engine URLs kept (an endpoint is a replica's; a table has hundreds at most).
MAX_TARGETS = 4096
# An answer's head is bounded as a request's is (``httpguard``): a hostile or broken
# engine cannot make the gateway buffer an endless header.
MAX_HEAD = 64 * 1024
# A byte that cannot be in a request-target or a host (RFC 9112): controls, space, DEL.
# urlsplit drops CR and LF, so an endpoint with them would otherwise be sent with a
# space in its request line; a NUL in a host makes getaddrinfo raise ValueError.
_UNSENDABLE = re.compile(r"[\x00-\x20\x7f]")
# The one failure where sending again is safe: the connection closed with no byte of an
# answer. A timeout is not: the engine had the request and may be working on it.
CLOSED_UNANSWERED = "connection closed before an answer"


class _EngineMisbehaved(Exception):
    """Raised in a parser callback to stop parsing (httptools then raises its own)."""


class Unreachable(Exception):
    """The engine did not answer usefully before its first byte: retry elsewhere."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class BrokenAnswer(Exception):
    """The answer's body broke off (closed, reset, timed out, unparseable)."""


class _Target:
    """One engine address: where to connect and the request head's fixed part."""

    __slots__ = ("host", "host_header", "key", "port", "ssl")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Unreachable(f"the endpoint {url[:100]!r} is not an http(s) URL")
        if _UNSENDABLE.search(parts.netloc):
            raise Unreachable(f"the endpoint {url[:100]!r} has a control byte or space in its host")
        try:
            port = parts.port
        except ValueError:
            raise Unreachable(f"the endpoint {url[:100]!r} has a bad port") from None
        self.host = parts.hostname
        self.ssl = parts.scheme == "https"
        self.port = port or (443 if self.ssl else 80)
        self.key = (self.host, self.port, self.ssl)
        self.host_header = parts.netloc.rsplit("@", 1)[-1].encode("idna")


class _Route:
    """A full URL split into its target and the request line's path; ``auth`` (an
    ``authorization`` header line, or empty) goes in its head."""

    __slots__ = ("auth", "head", "target")

    def __init__(self, url: str, auth: bytes = b"") -> None:
        self.auth = auth
        self.target = _Target(url)
        parts = urlsplit(url)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        if _UNSENDABLE.search(path):
            raise Unreachable(f"the endpoint {url[:100]!r} has a control byte or space in its path")
        self.head = (
            b"POST "
            + path.encode("ascii", "strict")
            + b" HTTP/1.1\r\nhost: "
            + self.target.host_header
            + b"\r\n"
            + auth
            + b"content-type: application/json\r\ncontent-length: "
        )


class Answer:
    """An engine's answer: status and headers read; the body as it comes."""

    __slots__ = ("_conn", "_finished", "headers", "status")

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        # Its own flag, not the connection's: once released, the connection may be
        # serving another request, which a second release or close must not touch.
        self._finished = False
        self.status: int = conn.status
        self.headers: dict[str, str] = conn.headers

    @property
    def complete(self) -> bool:
        """Every byte of the body was read (the connection may be reused)."""
        return self._conn.done and not self._conn.body

    @property
    def closed(self) -> bool:
        return self._finished

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body; ``BrokenAnswer`` past ``limit`` bytes (not read further)."""
        parts = []
        size = 0
        async for chunk in self.chunks():
            parts.append(chunk)
            size += len(chunk)
            if limit is not None and size > limit:
                raise BrokenAnswer(f"the answer is over {limit} bytes")
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (each piece once)."""
        conn = self._conn
        while True:
            if conn.body:
                yield conn.take()
                continue
            if conn.done:
                return
            if conn.error is not None:
                raise BrokenAnswer(conn.error)
            await conn.wait()

    async def piece(self) -> bytes | None:
        """The body's next piece as it arrives; None at its end (``chunks``, one at a
        time, for a caller that also ``relay``s)."""
        conn = self._conn
        while True:
            if conn.body:
                return conn.take()
            if conn.done:
                return None
            if conn.error is not None:
                raise BrokenAnswer(conn.error)
            await conn.wait()

    async def relay(
        self, sink: Callable[[bytes], bool], flush: Callable[[], object] | None = None
    ) -> None:
        """Hand the body's pieces to ``sink``: those waiting now, then each as it
        arrives, from the connection's read callback, with no task woken and nothing
        queued per piece. Returns when the body has ended or broken off (``piece`` then
        says which), or when ``sink`` refused a piece (returned False): that piece and
        what follows are left for ``piece``. ``sink`` must not raise: it runs inside
        the response parser.

        Why: a streamed answer's events, relayed one by one through ``chunks`` and the
        server's ``send``, each woke the request's task (a future, a generator step, a
        coroutine and ASGI's message dict): most of the gateway's CPU per event.

        ``flush``, if given, is called once after each read that relayed a piece: the
        sink may hold what it was handed (a transport that joins writes) and send the
        pieces of one read together, now rather than at the event loop's next turn."""
        conn = self._conn
        while True:
            while conn.body:
                if not sink(conn.body[0]):
                    return
                conn.take()
            if conn.done or conn.error is not None:
                return
            conn.relay = sink
            conn.relay_flush = flush
            try:
                await conn.wait()
            finally:
                conn.relay = None
                conn.relay_flush = None
            if conn.body:  # the piece the sink refused (it took every other)
                return

    def release(self) -> None:
        """Done with the answer: its connection goes back to the pool when complete."""
        if not self._finished:
            self._finished = True
            self._conn.finish(reuse=self.complete)

    def close(self) -> None:
        """Done with the answer, complete or not: its connection is closed."""
        if not self._finished:
            self._finished = True
            self._conn.finish(reuse=False)


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an engine, one request at a time."""

    def __init__(self, pool: EnginePool, target: _Target) -> None:
        self.pool = pool
        self.target = target
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.released = True
        self.idle_since = 0.0
        self._reset()
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False
        # Where body pieces go instead of ``body`` (``Answer.relay``), while set.
        self.relay: Callable[[bytes], bool] | None = None
        self.relay_flush: Callable[[], object] | None = None
        self.relayed = False  # the current read handed the relay a piece

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head_size = 0
        self.pending = 0
        self.header_done = False
        self.interim = False  # parsing a 1xx answer (skipped)
        self.progress = False  # a parser callback ran during the current feed
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.done = False
        self.received = False
        self.error: str | None = None
        self.last_read = 0.0
        self.framed = False  # the body has a length or is chunked (not ended by a close)

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received = True
        self.last_read = self.loop.time()
        if self.released:  # bytes nobody asked for: the connection is not reusable
            self.lost = True
            self._close()
            return
        self.progress = False
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            # (HttpParserUpgrade, for a 101, is not an HttpParserError: uncaught, it
            # escaped data_received.)
            self._fail(f"the engine's answer is not HTTP/1.1 ({exc})"[:200])
            self._close()
            return
        if self.relayed:
            self.relayed = False
            flush = self.relay_flush
            if flush is not None:
                flush()
        # httptools holds a header's value whole (a trailer's too, after the body)
        # before any callback sees it, and skips chunk extensions unseen: the bytes fed
        # since the last callback bound what it holds (plus one read).
        self.pending = 0 if self.progress else self.pending + len(data)
        if self.pending > MAX_HEAD or self.head_size > MAX_HEAD:
            self._fail(f"the engine's answer has a head over {MAX_HEAD} bytes")
            self._close()

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.released and not self.done:
            if self.header_done and not self.framed and exc is None:
                # A body ended by the close (no length, not chunked): a clean close
                # only. A reset (exc) is an engine that crashed or was killed: what came
                # is truncated, and was passed on as a complete 200.
                self.done = True
            else:
                self._fail(
                    CLOSED_UNANSWERED
                    if not self.header_done
                    else "the engine closed the connection in the middle of the answer"
                )
        self._wake()

    def pause_writing(self) -> None:  # a body over the socket's buffer: rare
        pass

    def resume_writing(self) -> None:
        pass

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.done:
            # A second answer to one request (or a body longer than its length): not
            # this answer's bytes, and not the next request's either.
            self.lost = True
            raise _EngineMisbehaved

    def on_header(self, name: bytes, value: bytes) -> None:
        self.progress = True
        # A whole head can come in one read: its fields are counted too (and trailers).
        self.head_size += len(name) + len(value) + 4
        if self.head_size > MAX_HEAD or self.header_done:
            return  # a trailer is not a header (a content-type in one replaced it)
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.progress = True
        if self.head_size > MAX_HEAD:
            return  # refused once the read is parsed
        status = self.parser.get_status_code()
        if status < 200:
            if status == 101:  # never asked for (no Upgrade sent)
                self._fail("the engine switched protocols (101)")
                raise _EngineMisbehaved
            # An interim answer (100 Continue, 103 Early Hints): the answer follows.
            self.interim = True
            self.headers.clear()
            return
        self.status = status
        self.header_done = True
        headers = self.headers
        self.framed = "content-length" in headers or "chunked" in headers.get(
            "transfer-encoding", ""
        )
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.progress = True
        relay = self.relay
        if relay is not None:
            if relay(body):
                self.relayed = True
                return
            self.relay = None  # refused: queued, and the relay's caller woken
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.progress = True
        if self.interim:
            self.interim = False
            return
        self.done = True
        if not self.parser.should_keep_alive():
            self.lost = True  # answered, then closed: not for the pool
        self._wake()

    # the caller's side
    def send(self, head: bytes, body: bytes) -> None:
        self._reset()
        self.released = False
        assert self.transport is not None
        self.transport.write(head + b"%d\r\n\r\n" % len(body) + body)
        self._arm()

    def take(self) -> bytes:
        chunk = self.body.popleft()
        self.buffered -= len(chunk)
        if self._paused and self.buffered <= HIGH_WATER // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    async def wait(self) -> None:
        """Until the next bytes, the end, or a failure."""
        waiter = self._waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def finish(self, *, reuse: bool) -> None:
        if self.released:
            return
        self.released = True
        # The read timer is left armed (see ``_arm``).
        transport = self.transport
        if (
            reuse
            and self.done
            and not self.lost
            and transport is not None
            # Nor with the request still unsent: an engine that answered from the head
            # alone may never read the body, and the next request waited behind it for
            # the read timeout.
            and not transport.get_write_buffer_size()
        ):
            self.body.clear()
            self.pool._put(self)
        else:
            self._close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, reason: str) -> None:
        if self.error is None:
            self.error = reason
        self._wake()

    def _close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    # The read timeout: one timer per connection, pushed on while bytes keep coming. It
    # stays armed across requests (a released connection's timer ends when it fires),
    # so a connection reused request after request makes no timer per request: making
    # and cancelling one was 1.3% of a request's CPU.
    def _arm(self) -> None:
        self.last_read = self.loop.time()
        if self._timer is None:
            self._timer = self.loop.call_at(self.last_read + self.pool.read_timeout_s, self._check)

    def _check(self) -> None:
        self._timer = None
        if self.released or self.done:
            return
        due = self.last_read + self.pool.read_timeout_s
        if self._paused:  # waiting on our reader, not on the engine
            due = self.loop.time() + self.pool.read_timeout_s
        if due > self.loop.time():
            self._timer = self.loop.call_at(due, self._check)
            return
        self._fail("timed out")
        self._close()


class EnginePool:
    """Keep-alive connections per engine; ``post`` is the one request it makes."""

    def __init__(
        self, connect_timeout_s: float, read_timeout_s: float, idle_s: float = IDLE_S
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.idle_s = idle_s
        self._idle: dict[tuple[str, int, bool], deque[_Connection]] = {}
        self._routes: dict[str, _Route] = {}
        self._ssl: ssl.SSLContext | None = None
        self._closed = False
        self._sweeper = self.loop.call_later(idle_s / 2, self._sweep)

    async def post(self, url: str, body: bytes, auth: bytes = b"") -> Answer:
        """POST ``body`` (JSON) to ``url``; the answer once its head is in. ``auth``: the
        engine's key as a header line (``gateway.table.Replica.auth``), or empty.

        ``Unreachable`` when no answer's first byte came (see the module)."""
        route = self._route(url, auth)
        conn, reused = self._take(route.target)
        if conn is None:
            conn = await self._connect(route.target)
        try:
            return await self._exchange(conn, route, body)
        except Unreachable as exc:
            if not reused or conn.received or exc.reason != CLOSED_UNANSWERED:
                raise
        # A kept-alive connection closed under the request, nothing read: the engine
        # never saw it. Once more on a new connection.
        conn = await self._connect(route.target)
        return await self._exchange(conn, route, body)

    async def _exchange(self, conn: _Connection, route: _Route, body: bytes) -> Answer:
        conn.send(route.head, body)
        try:
            while not conn.header_done:
                if conn.error is not None:
                    raise Unreachable(conn.error)
                await conn.wait()
        except BaseException:
            conn.finish(reuse=False)
            raise
        return Answer(conn)

    def _route(self, url: str, auth: bytes) -> _Route:
        route = self._routes.get(url)
        if route is None or (route.auth is not auth and route.auth != auth):
            try:
                route = _Route(url, auth)
            except UnicodeError:
                raise Unreachable(f"the endpoint {url[:100]!r} is not ASCII") from None
            if len(self._routes) >= MAX_TARGETS:
                self._routes.clear()
            self._routes[url] = route
        return route

    def _take(self, target: _Target) -> tuple[_Connection | None, bool]:
        idle = self._idle.get(target.key)
        if idle:
            # The sweep runs every idle_s / 2, so a connection can sit idle up to 1.5
            # idle_s before it closes it: past idle_s it is the engine's to close (the
            # race IDLE_S avoids), so it is not taken. The newest are taken first.
            stale = self.loop.time() - self.idle_s
            while idle:
                conn = idle.pop()  # the most recently used: the least likely to be closed
                if conn.idle_since <= stale:
                    conn._close()  # (and the older ones left are swept)
                    continue
                transport = conn.transport
                if not conn.lost and transport is not None and not transport.is_closing():
                    return conn, True
        return None, False

    async def _connect(self, target: _Target) -> _Connection:
        if self._closed:
            raise Unreachable("the gateway is stopping")
        context: ssl.SSLContext | None = None
        if target.ssl:
            if self._ssl is None:
                # Loading the CA bundle took 26-64 ms (load ~6): not on the loop, where
                # every stream in flight would wait for it.
                self._ssl = await asyncio.to_thread(ssl.create_default_context)
            context = self._ssl
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await self.loop.create_connection(
                    lambda: _Connection(self, target), target.host, target.port, ssl=context
                )
        except TimeoutError:
            raise Unreachable("timed out connecting") from None
        except ConnectionRefusedError as exc:
            raise Unreachable(f"connection refused ({exc.strerror or exc})") from None
        except (OSError, ssl.SSLError) as exc:
            raise Unreachable(f"cannot connect ({exc.strerror or exc})"[:200]) from None
        except ValueError as exc:  # a host getaddrinfo or IDNA refuses
            raise Unreachable(f"cannot connect ({exc})"[:200]) from None
        return conn

    def _put(self, conn: _Connection) -> None:
        if self._closed:
            conn._close()
            return
        idle = self._idle.setdefault(conn.target.key, deque())
        if len(idle) >= MAX_IDLE:
            conn._close()
            return
        conn.idle_since = self.loop.time()
        idle.append(conn)

    def _sweep(self) -> None:
        """Close connections idle for ``idle_s`` (before the engine does)."""
        cutoff = self.loop.time() - self.idle_s
        for key, idle in list(self._idle.items()):
            while idle and (idle[0].idle_since <= cutoff or idle[0].lost):
                idle.popleft()._close()
            if not idle:
                del self._idle[key]
        if not self._closed:
            self._sweeper = self.loop.call_later(self.idle_s / 2, self._sweep)

    async def close(self) -> None:
        self._closed = True
        self._sweeper.cancel()
        for idle in self._idle.values():
            for conn in idle:
                conn._close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports close
