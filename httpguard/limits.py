"""The limits on a request's head and on a server's connections. Pure."""

from __future__ import annotations

from dataclasses import dataclass

# What browsers and proxies send stays far below these: nginx's default head buffer
# is 8 KiB (4 x 8 KiB for large ones), Node's 16 KiB; 64 KiB leaves room for big
# cookies and tracing headers while bounding what one connection may make us hold.
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_HEADERS = 100
# A client has this long from its first byte (or from connecting) to finish the
# request line and headers: a real client sends them in one write.
DEFAULT_HEADER_TIMEOUT_S = 10.0
# An idle keep-alive connection is closed after this (uvicorn's own default).
DEFAULT_KEEP_ALIVE_TIMEOUT_S = 5.0
# Connections open at once; beyond it a new one is answered 503 and closed. Each
# open connection costs a few KiB and a file descriptor; the default descriptor
# limit (1024 soft) is what this keeps the server under.
DEFAULT_MAX_CONNECTIONS = 800
# A client that reads nothing of an answer the server has for it (its socket buffers
# full) for this long is dropped: otherwise it holds the request, and behind it an
# engine's slot and connection, for ever (a slow-read attack). nginx's send_timeout is
# 60 s too.
DEFAULT_WRITE_TIMEOUT_S = 60.0
# A request's body, once its head is in: whole within this long, and after the first
# ``header_timeout_s`` at least ``body_min_rate`` bytes a second on average (Apache's
# mod_reqtimeout has the same shape: ``body=20,MinRate=500``). A client on a slow link
# meets both: 1 KiB/s is a GPRS modem's rate, and the gateway's largest body (8 MiB)
# takes 120 s at 0.56 Mbit/s. A client dripping a body a byte a second is answered 408
# and closed 10 s after its head, instead of holding its connection for ever.
DEFAULT_BODY_TIMEOUT_S = 120.0
DEFAULT_BODY_MIN_RATE = 1024


@dataclass(frozen=True, slots=True)
class HeadLimits:
    """How much of a request's head a server accepts, and for how long it waits for it.

    ``max_header_bytes`` counts the request line and every header line as sent;
    ``max_headers`` the header lines. Past either the answer is 431. A head not
    complete ``header_timeout_s`` after its first byte (or after the connection
    opened) is answered 408 and the connection closed. A client that takes nothing of
    the answer for ``write_timeout_s`` while the server has bytes waiting for it is
    dropped. A body not complete ``body_timeout_s`` after its head, or behind
    ``body_min_rate`` bytes a second once ``header_timeout_s`` have passed (at ``t``
    seconds after the head at least ``body_min_rate * (t - header_timeout_s)`` bytes
    have arrived), is answered 408 and the connection closed.

    ``max_connections`` is not a number of clients but of sockets: when it is reached,
    a new connection takes the place of the oldest one with no request being served
    (see ``httpguard.protocol``); only when every connection has a request whose head
    and body have arrived is the new one answered 503.
    """

    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_headers: int = DEFAULT_MAX_HEADERS
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    keep_alive_timeout_s: float = DEFAULT_KEEP_ALIVE_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    body_min_rate: int = DEFAULT_BODY_MIN_RATE

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "max_headers", "max_connections", "body_min_rate"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in (
            "header_timeout_s",
            "keep_alive_timeout_s",
            "write_timeout_s",
            "body_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds")
