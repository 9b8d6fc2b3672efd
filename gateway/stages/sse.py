"""The framing of an engine's server-sent events, checked as the stream passes.

The gateway relays a streamed answer piece by piece as the engine writes it; bytes that
are not SSE (a broken or hostile engine's) must not reach the client as if they were
(a client's parser may take them as events, or stall). Well-formed here is what
OpenAI-compatible engines write, a subset of the WHATWG grammar: lines ended by LF
(CRLF included); each line empty (the end of an event), a comment (``:`` first), or a
field ``data``, ``event``, ``id`` or ``retry`` with its colon. Field values are not
judged (a ``data`` line's JSON is the client's to read), so the check costs a regular
expression over each piece, in C, and nothing per byte in Python.

A line is judged by its first bytes, which may come in one piece and its end in the
next: a line begun in one piece is held to a prefix a field could still have
(``da`` is fine, ``dx`` is not) and judged whole when its end comes.
"""

from __future__ import annotations

import re

# What a line may start with; a line begun may be cut short anywhere in these.
_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")
# Judging an unfinished line needs no more of it than the longest field's name.
_HEAD = 8
_LINE = re.compile(rb"(?:(?:data|event|id|retry)?:[^\n]*|\r)?\n")
_LINES = re.compile(rb"(?:(?:(?:data|event|id|retry)?:[^\n]*|\r)?\n)*")


def _may_start(head: bytes) -> bool:
    """Whether ``head``, the first bytes of an unfinished line, can still be SSE."""
    if head == b"\r":
        return True
    return any(f.startswith(head) or head.startswith(f) for f in _FIELDS)


def _complete(line: bytes) -> bool:
    """Whether a finished line that began as ``line`` (its first bytes and its end,
    when short) is SSE."""
    return line.startswith(_FIELDS) or line in (b"\n", b"\r\n")


class Framing:
    """The state of one stream's framing: where the last piece left the line."""

    __slots__ = ("_line",)

    def __init__(self) -> None:
        # The first bytes (up to ``_HEAD``) of the line the last piece left unfinished;
        # empty at the start of a line.
        self._line = b""

    def check(self, piece: bytes) -> int:
        """-1 when ``piece`` goes on the stream well-formed (and the state moves past
        it); else the offset in ``piece`` of the first line that is not SSE (the state
        is left as it was): what comes before it may be passed on."""
        line = self._line
        # An engine's usual piece, one event of one data line ("data: ...\n\n"): three
        # calls in C, about 60% of the expression's time.
        if (
            not line
            and piece.endswith(b"\n\n")
            and piece.startswith(b"data:")
            and piece.count(b"\n") == 2
        ):
            return -1
        if not line and piece.endswith(b"\n") and _LINES.fullmatch(piece):
            return -1  # whole lines, each SSE
        pos = 0
        if line:
            end = piece.find(b"\n")
            if end < 0:
                line = (line + piece[:_HEAD])[:_HEAD]
                if not _may_start(line):
                    return 0
                self._line = line
                return -1
            if not _complete((line + piece[: min(end + 1, _HEAD)])[: _HEAD + 1]):
                return 0
            pos = end + 1
        last = piece.rfind(b"\n", pos)
        if last >= 0:
            if not _LINES.fullmatch(piece, pos, last + 1):
                while (found := _LINE.match(piece, pos, last + 1)) is not None:
                    pos = found.end()
                return pos
            pos = last + 1
        rest = piece[pos : pos + _HEAD]
        if rest and not _may_start(rest):
            return pos
        self._line = rest
        return -1
