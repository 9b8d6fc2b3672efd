"""An answer's own header lines: the headers the gateway makes of its constants, names and
numbers, written as lines (``name: value\\r\\n`` each) in one piece rather than as pairs
the server checks one by one (``httpguard.protocol.RequestHooks.start``), and as pairs
again where a server takes only those."""

from __future__ import annotations


def pairs(head: bytes) -> list[tuple[bytes, bytes]]:
    """Header lines as ASGI's (name, value) pairs."""
    out = []
    for line in head.split(b"\r\n")[:-1]:
        name, _, value = line.partition(b": ")
        out.append((name, value))
    return out
