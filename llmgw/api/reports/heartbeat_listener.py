"""The heartbeat listener: a long-lived TCP connection per agent, one line per heartbeat.

A node report through the HTTP API costs the server a tenth of a millisecond of CPU
at best (a request's parsing, routing, a transaction); at 100,000 nodes every 10 s that
is a core on heartbeats alone. So a heartbeat is not a request: an agent keeps one
connection open to this listener (its own port, ``[server] heartbeat_port``, told to
the agent with each report's answer) and sends a line each interval::

    HB <node> <token> <report id>\\n

each with that node's own agent token, and reads one line back per heartbeat, in order:

- ``OK <node>``: the lease is renewed (``llmgw.api.reports.leases``);
- ``REPORT <node>``: this server does not hold that report; send the full report
  (``PUT /v1/nodes/{name}``), whose answer carries the new report id;
- ``DENIED <node> <reason>``: the token may not report that node (as the API's 401/403).

A connection may carry the heartbeats of many nodes (a simulator, or a host agent for
several nodes): every line is checked on its own. Everything is bounded: a line of at
most ``MAX_LINE`` bytes (longer, or not ASCII, is answered ``BAD <reason>`` and the
connection closed), at most ``max_connections`` open (one more is answered ``BUSY`` and
closed: the agent then sends full reports, as an old agent does), a connection silent
for ``idle_timeout_s`` closed, and reading paused while the answers are not read (so a
client that never reads cannot make the server buffer without end). Nothing waits on
the database: a heartbeat is a dictionary lookup and a hash, answered at once.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any, cast

import structlog

from llmgw.api.guards.tokens import TokenBook
from llmgw.api.reports.leases import LeaseBook

log = structlog.get_logger("llmgw.api")

MAX_LINE = 512
MAX_CONNECTIONS = 10_000
IDLE_TIMEOUT_S = 300.0


class HeartbeatListener:
    def __init__(
        self,
        leases: LeaseBook,
        book: TokenBook,
        *,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.leases = leases
        self.book = book
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self.open: set[_Connection] = set()
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
        log.info("api.heartbeats_listening", host=host, port=bound, datagrams=bool(self._datagrams))
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
        """The answers to complete lines, and whether to close the connection after them."""
        beats: list[tuple[str, str]] = []
        out: list[bytes | None] = []
        for line in lines:
            parts = line.split(b" ")
            if len(parts) != 4 or parts[0] != b"HB" or not line.isascii():
                out.append(b"BAD expected 'HB <node> <token> <report id>'\n")
                return _joined(out, beats, self.leases), True
            _, node_b, token_b, report_b = parts
            node = node_b.decode()
            who = self.book.verify(token_b.decode())
            if who is None:
                out.append(b"DENIED " + node_b + b" unknown token\n")
                continue
            if not who.may_report(node):
                out.append(b"DENIED " + node_b + b" this token may not report this node\n")
                continue
            beats.append((node, report_b.decode()))
            out.append(None)  # answered once the batch is renewed
        return _joined(out, beats, self.leases), False


def _joined(out: list[bytes | None], beats: list[tuple[str, str]], leases: LeaseBook) -> bytes:
    taken = iter(leases.renew(beats, datetime.now(UTC)) if beats else ())
    names = iter(beats)
    parts = []
    for answer in out:
        if answer is None:
            node = next(names)[0].encode()
            parts.append((b"OK " if next(taken) else b"REPORT ") + node + b"\n")
        else:
            parts.append(answer)
    return b"".join(parts)


class _Datagrams(asyncio.DatagramProtocol):
    """Heartbeats as datagrams: the same lines, each datagram answered by one to its sender.

    Nothing is kept per sender, so a fleet larger than a process's descriptors can beat
    to one server. A datagram is at most 64 KiB by nature; its lines are bounded as a
    connection's are, and a bad one is answered ``BAD`` with the rest of it unread.
    """

    def __init__(self, listener: HeartbeatListener) -> None:
        self.listener = listener
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if self.transport is None:
            return
        lines = data.split(b"\n")
        if lines and not lines[-1]:
            lines.pop()
        if not lines or any(len(line) > MAX_LINE for line in lines):
            self.transport.sendto(b"BAD a line is empty or longer than %d bytes\n" % MAX_LINE, addr)
            return
        answer, _ = self.listener.answer(lines)
        self.transport.sendto(answer, addr)

    def error_received(self, exc: Exception) -> None:
        pass  # an unreachable sender (ICMP): nothing to do, nothing kept


class _Connection(asyncio.Protocol):
    def __init__(self, listener: HeartbeatListener) -> None:
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.last = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)
        if len(self.listener.open) >= self.listener.max_connections:
            self.transport.write(b"BUSY too many heartbeat connections; send full reports\n")
            transport.close()
            return
        self.listener.open.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener.open.discard(self)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.last = time.monotonic()
        buffer = self.buffer + data if self.buffer else data
        lines = buffer.split(b"\n")
        rest = lines.pop()
        if len(rest) > MAX_LINE or any(len(line) > MAX_LINE for line in lines):
            self.transport.write(b"BAD a line is longer than %d bytes\n" % MAX_LINE)
            self.close()
            return
        self.buffer = rest
        if not lines:
            return
        answer, close = self.listener.answer(lines)
        self.transport.write(answer)
        if close:
            self.close()

    # The client does not read its answers: stop reading its heartbeats until it does.
    def pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def close(self) -> None:
        self.listener.open.discard(self)
        if self.transport is not None:
            self.transport.close()
