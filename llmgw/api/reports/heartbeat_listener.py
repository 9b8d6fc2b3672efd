"""The heartbeat listener: a long-lived TCP connection per agent, one line per heartbeat.

A node report through the HTTP API costs the server a tenth of a millisecond of CPU
at best (a request's parsing, routing, a transaction); at 100,000 nodes every 10 s that
is a core on heartbeats alone. So a heartbeat is not a request: an agent keeps one
connection open to this listener (its own port, ``[server] heartbeat_port``, told to
the agent with each report's answer) and sends a line each interval::

    HB <node> <token> <report id>\\n

each with that node's own agent token, and reads one line back per heartbeat, in order:

- ``OK <node> <generation>``: the lease is renewed (``llmgw.api.reports.leases``); the
  generation is the node's placement generation
  (``llmgw.api.reports.placement_generations``): while it is the one the agent read its
  placements under, they have not changed (``OK <node>`` alone before it is known; an
  agent of before generations reads the third word as a reason, and ignores it);
- ``REPORT <node>``: this server does not hold that report; send the full report
  (``PUT /v1/nodes/{name}``), whose answer carries the new report id;
- ``DENIED <node> <reason>``: the token may not report that node (as the API's 401/403);
  the connection is closed after it.

A connection may carry the heartbeats of many nodes (a simulator, or a host agent for
several nodes): every line is checked on its own. The port is open to anyone who can
reach it, so everything is bounded (docs/security/hostile-input-agent-and-headers.md):

- a line of at most ``MAX_LINE`` bytes; longer, not ASCII or not four words is answered
  ``BAD <reason>`` and the connection closed, as is the first ``DENIED``: a sender
  without a valid token costs one hash and holds no connection;
- at most ``MAX_LINES`` lines answered per turn of the listener's loop for one
  connection (reading from it paused until the rest is answered), so one fast sender
  cannot keep the others waiting;
- at most ``max_connections`` open (one more takes the place of the oldest on which no
  heartbeat was taken yet, else is answered ``BUSY`` and closed: the agent then sends
  full reports, as an old agent does), a connection without a heartbeat answered for
  ``idle_timeout_s`` closed (bytes of a line never ended do not count), and reading
  paused while the answers are not read (so a client that never reads cannot make the
  server buffer without end);
- a datagram of more than ``MAX_LINES`` lines, or with a line that is not a well-formed
  heartbeat of a valid token, is dropped unanswered: a datagram's sender can be forged,
  so only a well-formed, authenticated datagram is answered, and never by more bytes
  than it carried (no reflection, no amplification).

The listener runs on its own thread with its own event loop (``ListenerThread``), not
the API's: whatever arrives on the heartbeat port, the API and ``/healthz`` keep
their loop. Nothing waits on the database: a heartbeat is a dictionary lookup and a
hash, answered at once; renewals go to the lease writer under its lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

import structlog

from llmgw.api.guards.tokens import TokenBook
from llmgw.api.reports.leases import LeaseBook

log = structlog.get_logger("llmgw.api")

MAX_LINE = 512
# Lines answered per datagram, and per connection per turn of the loop. An agent sends
# one line an interval; the benchmark's simulator batches 40-50 nodes on a line each.
MAX_LINES = 64
MAX_CONNECTIONS = 10_000
IDLE_TIMEOUT_S = 300.0
# How long stopping waits for the listener's loop to close its sockets.
STOP_TIMEOUT_S = 10.0

_BUSY = b"BUSY too many heartbeat connections; send full reports\n"
_BAD_LINE = b"BAD expected 'HB <node> <token> <report id>'\n"


class HeartbeatListener:
    def __init__(
        self,
        leases: LeaseBook,
        book: TokenBook | Callable[[], TokenBook],
        *,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.leases = leases
        # The tokens in force, asked at each line: the API makes its book again whenever
        # the tokens table changes (a token issued or revoked on any replica), and a
        # listener holding the book of its start refused every agent token issued after
        # it (seen by a newcomer: DENIED "unknown token" every tick).
        self._book = book if callable(book) else (lambda: book)
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self.open: set[_Connection] = set()
        # The open connections no heartbeat was taken on yet, oldest first: when every
        # slot is taken, the oldest of them gives way to a new one (no token is needed
        # to open one, and a sender without a token must not keep the agents out).
        self.unproven: dict[_Connection, None] = {}
        self.dropped = 0  # datagrams dropped unanswered (too many lines, bad or denied)
        self._server: asyncio.Server | None = None
        self._datagrams: asyncio.DatagramTransport | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; the port listened on."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, reuse_address=True, backlog=1024
        )
        self._sweeper = loop.create_task(self._sweep())
        bound: int = self._server.sockets[0].getsockname()[1]
        try:
            # The same port number for datagrams: no descriptor per agent.
            self._datagrams, _ = await loop.create_datagram_endpoint(
                lambda: _Datagrams(self), local_addr=(host, bound)
            )
        except OSError as exc:
            log.warning("api.heartbeat_datagrams_off", port=bound, error=str(exc))
        self.leases.port = bound
        log.info(
            "api.heartbeats_listening",
            host=host,
            port=bound,
            datagrams=bool(self._datagrams),
            max_connections=self.max_connections,
        )
        return bound

    async def stop(self) -> None:
        self.leases.port = None
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._datagrams is not None:
            self._datagrams.close()
        if self._server is not None:
            self._server.close()
            for conn in list(self.open):
                conn.close()
            await self._server.wait_closed()

    async def _sweep(self) -> None:
        """Close connections silent for longer than ``idle_timeout_s``."""
        while True:
            await asyncio.sleep(max(self.idle_timeout_s / 4, 0.05))
            limit = time.monotonic() - self.idle_timeout_s
            for conn in [c for c in self.open if c.last < limit]:
                conn.close()

    def answer(self, lines: list[bytes]) -> tuple[bytes, bool]:
        """The answers to complete lines, and whether to close the connection after them
        (at the first BAD or DENIED line, whose answer is the last: the rest is unread)."""
        beats: list[tuple[str, str]] = []
        out: list[bytes | None] = []
        for line in lines:
            checked = self._check(line)
            if isinstance(checked, bytes):
                out.append(checked)
                return _joined(out, beats, self.leases), True
            beats.append(checked)
            out.append(None)  # answered once the batch is renewed
        return _joined(out, beats, self.leases), False

    def _check(self, line: bytes) -> tuple[str, str] | bytes:
        """A well-formed heartbeat of a token that may report its node: ``(node, report
        id)``; else the refusal to answer it with."""
        parts = line.split(b" ")
        if len(parts) != 4 or parts[0] != b"HB" or not line.isascii() or len(line) > MAX_LINE:
            return _BAD_LINE
        _, node_b, token_b, report_b = parts
        node = node_b.decode()
        who = self._book().verify(token_b.decode())
        if who is None:
            return b"DENIED " + node_b + b" unknown token\n"
        if not who.may_report(node):
            return b"DENIED " + node_b + b" this token may not report this node\n"
        return node, report_b.decode()

    def answer_datagram(self, data: bytes) -> bytes | None:
        """The answer to a datagram, or None to drop it unanswered: at most ``MAX_LINES``
        lines, each a heartbeat its token may send, and an answer no longer than it."""
        lines = data.split(b"\n", MAX_LINES)
        if lines and not lines[-1]:
            lines.pop()
        if not lines or len(lines) > MAX_LINES:
            return None
        beats = []
        for line in lines:
            checked = self._check(line)
            if isinstance(checked, bytes):
                return None
            beats.append(checked)
        answer = _joined([None] * len(beats), beats, self.leases)
        return answer if len(answer) <= len(data) else None


def _joined(out: list[bytes | None], beats: list[tuple[str, str]], leases: LeaseBook) -> bytes:
    taken = iter(leases.renew(beats, datetime.now(UTC)) if beats else ())
    names = iter(beats)
    generation = leases.generations.of
    parts = []
    for answer in out:
        if answer is None:
            name = next(names)[0]
            if not next(taken):
                parts.append(b"REPORT %s\n" % name.encode())
                continue
            told = generation(name)
            if told is None:
                parts.append(b"OK %s\n" % name.encode())
            else:
                parts.append(b"OK %s %d\n" % (name.encode(), told))
        else:
            parts.append(answer)
    return b"".join(parts)


class ListenerThread:
    """The listener on a thread of its own, with its own event loop: a flood of the
    heartbeat port (a connection or datagrams, no token needed) costs that thread, and
    the API's loop keeps answering. Its sole shared state is the lease book (renewals
    under its lock) and the token book (read only)."""

    def __init__(self, listener: HeartbeatListener) -> None:
        self.listener = listener
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, host: str, port: int) -> int:
        """Listen on a new thread; the port listened on (the error, if it cannot)."""
        started: concurrent.futures.Future[int] = concurrent.futures.Future()
        loop = _new_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                started.set_result(loop.run_until_complete(self.listener.start(host, port)))
            except BaseException as exc:  # told to the starter, who raises it
                started.set_exception(exc)
                loop.close()
                return
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="heartbeats", daemon=True)
        self._thread.start()
        return started.result()

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self.listener.stop(), loop).result(STOP_TIMEOUT_S)
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            log.warning("api.heartbeats_stop_slow", error=str(exc) or type(exc).__name__)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(STOP_TIMEOUT_S)


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop where installed (a dependency of the server), else asyncio's. Each
    heartbeat is an event of its own (an agent's line a connection an interval): asyncio's
    selector loop took about half the listener's CPU per heartbeat in its own Python
    (docs/benchmarks/heartbeats.md), uvloop's is C."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover: installed with the server
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class _Datagrams(asyncio.DatagramProtocol):
    """Heartbeats as datagrams: the same lines, a datagram answered by one to its sender.

    Nothing is kept per sender, so a fleet larger than a process's descriptors can beat
    to one server. Since a sender can be forged, only a datagram of well-formed lines of
    valid tokens is answered (``HeartbeatListener.answer_datagram``); any other is
    dropped unanswered, with the rest of it unread.
    """

    def __init__(self, listener: HeartbeatListener) -> None:
        self.listener = listener
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if self.transport is None:
            return
        answer = self.listener.answer_datagram(data)
        if answer is None:
            self.listener.dropped += 1
            return
        self.transport.sendto(answer, addr)

    def error_received(self, exc: Exception) -> None:
        pass  # an unreachable sender (ICMP): nothing to do, nothing kept


class _Connection(asyncio.Protocol):
    def __init__(self, listener: HeartbeatListener) -> None:
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.pos = 0  # where the unanswered part of ``buffer`` starts
        self.last = time.monotonic()
        self.closed = False
        # Reading is paused while the client does not read its answers, and while the
        # lines already read wait for a later turn of the loop (MAX_LINES a turn).
        self.writing_paused = False
        self.backlog = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)
        listener = self.listener
        if len(listener.open) >= listener.max_connections:
            if not listener.unproven:
                self.transport.write(_BUSY)
                self.closed = True
                transport.close()
                return
            oldest = next(iter(listener.unproven))
            if oldest.transport is not None:
                oldest.transport.write(_BUSY)
            oldest.close()
        listener.open.add(self)
        listener.unproven[self] = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.listener.open.discard(self)
        self.listener.unproven.pop(self, None)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.buffer = self.buffer[self.pos :] + data if self.buffer else data
        self.pos = 0
        if not self.backlog:
            self._answer()

    def _answer(self) -> None:
        """Answer at most ``MAX_LINES`` complete lines; the rest on a later turn."""
        assert self.transport is not None
        self.backlog = False
        if self.closed:
            return
        buffer, pos = self.buffer, self.pos
        lines: list[bytes] = []
        while len(lines) < MAX_LINES:
            end = buffer.find(b"\n", pos, pos + MAX_LINE + 1)
            if end < 0:
                break
            lines.append(buffer[pos:end])
            pos = end + 1
        more = len(lines) == MAX_LINES and buffer.find(b"\n", pos, pos + MAX_LINE + 1) >= 0
        if not more and len(buffer) - pos > MAX_LINE:
            # No end of line within MAX_LINE bytes: a line too long (or no lines at all).
            self.transport.write(self.listener.answer(lines)[0] if lines else b"")
            self.transport.write(b"BAD a line is longer than %d bytes\n" % MAX_LINE)
            self.close()
            return
        if pos == len(buffer):
            self.buffer, self.pos = b"", 0
        else:
            self.pos = pos
        if lines:
            answer, close = self.listener.answer(lines)
            self.transport.write(answer)
            if close:
                self.close()
                return
            # Silent is without a heartbeat answered: a byte at a time of a line never
            # ended (up to MAX_LINE of them) held a connection as long as it dripped.
            self.last = time.monotonic()
            self.listener.unproven.pop(self, None)
        if more:
            self.backlog = True
            asyncio.get_running_loop().call_soon(self._answer)
        self._reading()

    def _reading(self) -> None:
        if self.transport is None or self.closed:
            return
        if self.writing_paused or self.backlog:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    # The client does not read its answers: stop reading its heartbeats until it does.
    def pause_writing(self) -> None:
        self.writing_paused = True
        self._reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._reading()

    def close(self) -> None:
        self.closed = True
        self.listener.open.discard(self)
        self.listener.unproven.pop(self, None)
        if self.transport is not None:
            self.transport.close()
