"""``gateway.stages.sse.Framing``: a stream's SSE framing judged piece by piece, however the
engine's writes split it, as the whole stream would be judged at once."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.stages.sse import Framing

GOOD_LINES = st.sampled_from(
    [
        b'data: {"choices":[{"delta":{"content":"hi"}}]}\n',
        b"data: [DONE]\n",
        b"data:x\r\n",
        b": keep-alive\n",
        b"event: message\n",
        b"id: 7\n",
        b"retry: 100\n",
        b"\n",
        b"\r\n",
        b"data: a\rb\n",  # a CR inside a value is the value's
    ]
)
BAD_LINES = st.sampled_from(
    [
        b"garbage\n",
        b"HTTP/1.1 200 OK\r\n",
        b'{"choices": []}\n',
        b"dat: x\n",
        b"data\n",  # (valid per WHATWG; no engine writes it: refused here)
        b"\x00\x01\n",
        b"<html>\n",
    ]
)


def _split(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    return [stream[a:b] for a, b in itertools.pairwise(points) if b > a]


def _passed(pieces: list[bytes]) -> tuple[bytes, bool]:
    """What a relay passes on, and whether it found the stream malformed."""
    framing, out = Framing(), b""
    for piece in pieces:
        bad = framing.check(piece)
        if bad >= 0:
            return out + piece[:bad], True
        out += piece
    return out, False


@settings(max_examples=300, deadline=None)
@given(
    st.lists(GOOD_LINES, max_size=30),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
)
def test_a_well_formed_stream_passes_whole_however_it_is_split(
    lines: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(lines)
    assert _passed(_split(stream, cuts)) == (stream, False)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(GOOD_LINES, max_size=20),
    BAD_LINES,
    st.lists(GOOD_LINES, max_size=5),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
)
def test_a_malformed_line_is_found_and_nothing_of_it_past_its_first_bytes_is_passed(
    before: list[bytes], bad: bytes, after: list[bytes], cuts: list[int]
) -> None:
    good = b"".join(before)
    stream = good + bad + b"".join(after)
    passed, malformed = _passed(_split(stream, cuts))
    assert malformed
    # Whole lines before it pass; of the bad line, at most the few bytes a field could
    # still have begun with (``da`` of ``dat:``) when a piece ended there.
    assert passed.startswith(good) and len(passed) - len(good) < len(b"retry:")
    assert stream.startswith(passed)


def test_an_unfinished_line_is_judged_by_its_first_bytes_at_once() -> None:
    framing = Framing()
    assert framing.check(b"data: {") == -1
    assert framing.check(b'"a": 1}\n\nda') == -1
    assert framing.check(b"ta: x\n\n") == -1
    assert Framing().check(b"<html><body>an error page") == 0
    assert Framing().check(b"data: ok\n\nnot sse") == len(b"data: ok\n\n")
