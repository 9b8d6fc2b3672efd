"""The agent's heartbeat: "nothing changed since report N", on one long-lived connection.

When nothing the agent would report has changed since its last accepted report (and
that report is younger than ``full_report_every``), the agent does not send the report
again: it sends one line on a TCP connection it keeps open to the control plane's
heartbeat listener (``llmgw.api.reports.heartbeat_listener``), naming the report's id,
and reads one line back: ``OK`` (the node's lease is renewed), ``REPORT`` (the server
does not hold that report: a restart, another replica; send the full report) or
``DENIED``. A control plane that answers reports with no ``report_id`` and
``heartbeat_port`` is older than heartbeats: the agent sends full reports to it, as before.

Standard library only, like ``agent.client``; every read is bounded in size and time.
"""

from __future__ import annotations

import hashlib
import json
import socket
from dataclasses import dataclass
from typing import Any

from agent.client import Unreachable
from agent.processes import printable

MAX_ANSWER_LINE = 1024


@dataclass(frozen=True, slots=True)
class Accepted:
    """The last full report the control plane accepted: what heartbeats name."""

    digest: str
    report_id: str
    port: int
    at: float  # the agent's clock
    server: str  # the URL of the server that accepted it: its listener is on that host

    @classmethod
    def of(cls, answer: Any, digest: str, at: float, server: str) -> Accepted | None:
        """From a report's answer; None from a control plane without heartbeats."""
        if not isinstance(answer, dict):
            return None
        report_id, port = answer.get("report_id"), answer.get("heartbeat_port")
        if not isinstance(report_id, str) or not _word(report_id):
            return None
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            return None
        return cls(digest, report_id, port, at, server)


def digest(body: Any) -> str:
    """What a report says, as a digest: equal digests, nothing to report."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class HeartbeatChannel:
    """One connection to a control plane's heartbeat listener, opened when first used
    and again after any failure."""

    def __init__(self, host: str, timeout: float, *, datagrams: bool = False) -> None:
        self.host = host
        self.timeout = timeout
        # Datagrams: no connection, so no descriptor on the server for this agent.
        self.datagrams = datagrams
        self._sock: socket.socket | None = None
        self._port: int | None = None
        self._buffer = b""

    def beat(self, node: str, token: str, accepted: Accepted) -> tuple[str, str]:
        """Send one heartbeat; the answer's word (OK, REPORT, DENIED...) and the rest.
        ``Unreachable`` if no answer came."""
        if not (_word(node) and _word(token)):
            return "REPORT", "the node or token cannot be sent on a heartbeat line"
        line = f"HB {node} {token} {accepted.report_id}\n".encode()
        if self.datagrams:
            return self._datagram(node, line, accepted.port)
        while True:
            # A connection kept from before may have been closed by the server (a restart,
            # its idle timeout): then once more on a new one before giving up.
            reused = self._sock is not None and self._port == accepted.port
            try:
                sock = self._connect(accepted.port)
                sock.sendall(line)
                answer = self._read_line(sock)
                break
            except OSError as exc:
                self.close()
                if not reused:
                    raise Unreachable(f"heartbeat: {printable(str(exc))}") from None
        word, _, rest = answer.partition(" ")
        if word in ("OK", "REPORT", "DENIED"):
            name, _, reason = rest.partition(" ")
            if name != node:
                self.close()
                raise Unreachable(f"heartbeat: an answer for {printable(name)!r}, not {node!r}")
            return word, reason
        self.close()  # BUSY, BAD: the server closes the connection after these
        return word or "BAD", rest

    def _datagram(self, node: str, line: bytes, port: int) -> tuple[str, str]:
        """One datagram out, and its answer (an answer to an earlier one, for this node,
        means the same); ``Unreachable`` after ``timeout`` without one (lost either way)."""
        try:
            if self._sock is None or self._port != port:
                self.close()
                family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_DGRAM)
                sock.settimeout(self.timeout)
                sock.connect((self.host, port))  # only the server's datagrams are read
                self._sock, self._port = sock, port
            self._sock.send(line)
            answer = self._sock.recv(MAX_ANSWER_LINE)
        except OSError as exc:
            self.close()
            raise Unreachable(f"heartbeat: {printable(str(exc))}") from None
        text = printable(answer.split(b"\n", 1)[0].decode("ascii", "replace"))
        word, _, rest = text.partition(" ")
        name, _, reason = rest.partition(" ")
        if word in ("OK", "REPORT", "DENIED") and name == node:
            return word, reason
        return word or "BAD", rest

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._port, self._buffer = None, None, b""

    def _connect(self, port: int) -> socket.socket:
        if self._sock is not None and self._port == port:
            return self._sock
        self.close()
        sock = socket.create_connection((self.host, port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock, self._port = sock, port
        return sock

    def _read_line(self, sock: socket.socket) -> str:
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_ANSWER_LINE:
                raise OSError("the heartbeat answer is too long")
            data = sock.recv(4096)
            if not data:
                raise OSError("the control plane closed the heartbeat connection")
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return printable(line.decode("ascii", "replace"))[:MAX_ANSWER_LINE]


def _word(text: str) -> bool:
    """Sendable as one field of a heartbeat line: printable ASCII, no space."""
    return 0 < len(text) <= 255 and text.isascii() and text.isprintable() and " " not in text
