"""The engine's own token counts of an answer (``usage``), and its usage event on streams.

A stream carries ``usage`` only when asked (``stream_options.include_usage``): the
gateway asks for it on every stream, so that a request's tokens settle to the engine's
count (gateway.stages.quota) and are counted per client (``llmgw_gateway_tokens_total``),
and ``Events`` takes the usage event out again when the client did not ask for it: the
client gets the stream it would have had. The event taken out is the one OpenAI and the
engines end such a stream with: ``choices`` empty, ``usage`` an object. (An engine that
also puts ``"usage": null`` in the other events, as OpenAI does, has it passed on: the
SDKs read it as no usage.)
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import msgspec

_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d{1,12})')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d{1,12})')
_CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d{1,12})')
ASK = b'"stream_options":{"include_usage":true},'
# A stream's bytes held while an event's end is awaited; past this, passed on as they
# are (an engine that never ends its events is not one whose usage event is taken out).
MAX_PENDING = 64 * 1024
# (Every test of a stream's bytes for a substring here and in gateway.proxy is
# ``find``, never ``in``: CPython's ``bytes.__contains__`` first tries the needle as an
# integer (``b"x" in data`` may ask for a byte value), and a bytes needle fails that by
# raising and formatting a TypeError it then clears: about 1,900 instructions a test
# under callgrind against about 300 for ``find``, four tests a piece of every stream.)


class Usage(NamedTuple):
    """An answer's usage: prompt tokens (of which ``cached`` the engine reused) and
    completion tokens. (A tuple: a frozen dataclass took five times as long to make,
    on every answer.)"""

    prompt: int
    cached: int
    completion: int

    @property
    def total(self) -> int:
        return self.prompt + self.completion


def parse(payload: bytes) -> Usage | None:
    """The counts of an answer's (or an event's) ``usage``; None without one."""
    # From the last "usage" on: an answer ends with it, and the text before it (the
    # answer's own) is not scanned three times.
    start = payload.rfind(b'"usage"')
    if start < 0:
        return None
    completion = _COMPLETION.search(payload, start)
    prompt = _PROMPT.search(payload, start)
    if completion is None and prompt is None:
        return None
    cached = _CACHED.search(payload, start)
    return Usage(
        int(prompt.group(1)) if prompt else 0,
        int(cached.group(1)) if cached else 0,
        int(completion.group(1)) if completion else 0,
    )


def asked(body: dict[str, Any]) -> bool:
    """Whether the client asked for the usage event itself."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def ask(body: dict[str, Any], raw: bytes) -> bytes | None:
    """``raw`` with the usage event asked for, as bytes; None when the body must be
    encoded again (it has ``stream_options`` of its own). A JSON object's first member
    inserted: no encoding of the body again for the common case."""
    if "stream_options" in body:
        return None
    start = raw.find(b"{")
    return raw[: start + 1] + ASK + raw[start + 1 :]


class _Event(msgspec.Struct):
    """What of an event's JSON says whether it is the usage event; its other members
    (id, model, created...) are skipped by the decoder, not built."""

    choices: Any = None
    usage: Any = None
    error: Any = msgspec.UNSET


_decode_event = msgspec.json.Decoder(_Event).decode


def _usage_of(data: bytes) -> Usage | None:
    """The counts of one event's data (JSON) when it is the stream's usage event
    (choices empty, no error, usage an object with a prompt or completion count); None
    for any other."""
    try:
        event = _decode_event(data)
    except (msgspec.DecodeError, RecursionError):  # (ValidationError: not an object)
        return None
    if event.choices or event.error is not msgspec.UNSET:
        return None
    counts = event.usage
    if not isinstance(counts, dict):
        return None
    prompt, completion = _count(counts, "prompt_tokens"), _count(counts, "completion_tokens")
    if prompt is None and completion is None:
        return None
    details = counts.get("prompt_tokens_details")
    cached = _count(details, "cached_tokens") if isinstance(details, dict) else None
    return Usage(prompt or 0, cached or 0, completion or 0)


def _usage_only(event: bytes) -> Usage | None:
    """The counts of one event (its lines) when it is the stream's usage event."""
    for line in event.splitlines():
        if line.startswith(b"data:"):
            return _usage_of(line[5:].strip())
    return None


def _count(counts: dict[str, Any], name: str) -> int | None:
    value = counts.get(name)
    if type(value) is int and 0 <= value < 10**12:  # (as parse reads: at most 12 digits)
        return value
    return None


class Events:
    """A stream's bytes cut at event ends: what to pass on now, the usage seen, and
    (``strip``) the usage event taken out. ``peek`` says what a piece gives without
    taking it (the relay may be refused a write), ``commit`` takes it."""

    __slots__ = ("pending", "strip", "usage")

    def __init__(self, strip: bool) -> None:
        self.strip = strip
        self.pending = b""
        self.usage: Usage | None = None

    def peek(self, chunk: bytes) -> tuple[bytes, bytes, Usage | None]:
        """(to pass on, to hold, the usage in it) for ``chunk`` after what is held."""
        if not self.pending and chunk.endswith(b"\n\n"):
            if chunk.find(b'"usage"') < 0:
                return chunk, b"", None  # (nearly every piece: whole events, no usage)
            if self.strip and chunk.startswith(b"data:") and chunk.count(b"\n") == 2:
                # One event of one data line: the usage event comes after the last token,
                # so it is most often a piece of its own. Its JSON read once, not split.
                found = _usage_of(chunk[5:])
                if found is not None:
                    return b"", b"", found
        buf = self.pending + chunk if self.pending else chunk
        end = buf.rfind(b"\n\n")
        if end < 0:
            if len(buf) > MAX_PENDING:
                return buf, b"", None
            return b"", buf, None
        out, held = buf[: end + 2], buf[end + 2 :]
        if out.find(b'"usage"') < 0 or out.find(b"_tokens") < 0:
            return out, held, None
        if self.strip:
            # Each event read once: the usage event's counts from its own decoding (the
            # regexes and a second decoding of it cost as much again).
            events = out.split(b"\n\n")[:-1]
            kept, found = [], None
            for e in events:
                counts = _usage_only(e) if e.find(b'"usage"') >= 0 else None
                if counts is None:
                    kept.append(e)
                else:
                    found = counts
            if found is not None:
                return b"".join(e + b"\n\n" for e in kept), held, found
        return out, held, parse(out)

    def commit(self, held: bytes, usage: Usage | None) -> None:
        self.pending = held
        if usage is not None:
            self.usage = usage

    def take(self, chunk: bytes) -> bytes:
        out, held, usage = self.peek(chunk)
        self.commit(held, usage)
        return out

    def rest(self) -> bytes:
        """What is still held, at the stream's end: passed on as it is."""
        rest, self.pending = self.pending, b""
        return rest
