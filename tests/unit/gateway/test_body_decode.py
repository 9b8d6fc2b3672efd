"""A request body is decoded by msgspec, with ``json.loads`` behind it, to the same objects.

``gateway.server._loads`` tries msgspec first (2-3x faster for a chat body) and falls
back to ``json.loads`` for whatever msgspec refuses, so what is accepted, what it
decodes to, and how a refusal is worded stay those of ``json.loads``. And the depth
check takes a shortcut on the raw text (``admission._shallow``) that must never let a
deep body through.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.server import _loads
from gateway.stages import admission
from gateway.stages.admission import MAX_DEPTH, Refusal

ACCEPTED_BY_JSON_ONLY = [
    b'{"temperature": NaN}',
    b'{"temperature": Infinity}',
    b'{"x": 1e400}',
    b'{"content": "\\ud800"}',  # a lone surrogate escape
    b'\xef\xbb\xbf{"model": "m"}',  # a UTF-8 byte-order mark
    '{"model": "m"}'.encode("utf-16"),
]


@pytest.mark.parametrize("raw", ACCEPTED_BY_JSON_ONLY)
def test_what_json_loads_accepts_is_still_accepted_as_it_decoded_it(raw: bytes) -> None:
    got, want = _loads(raw), json.loads(raw)
    assert repr(got) == repr(want)


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b'{"a": "\xff"}', "the body is not UTF-8"),
        (b'{"a": 1}x', "the body is not JSON: Extra data"),
        (b"{", "the body is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
    ],
)
def test_refusals_are_worded_as_json_loads_words_them(raw: bytes, words: str) -> None:
    with pytest.raises(Refusal) as refused:
        _loads(raw)
    assert refused.value.status == 400
    assert words in refused.value.message


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES)
def test_msgspec_decodes_to_what_json_loads_would(value: object) -> None:
    for raw in (json.dumps(value).encode(), json.dumps(value, ensure_ascii=False).encode()):
        got, want = _loads(raw), json.loads(raw)
        assert got == want
        assert type(got) is type(want)


def _nested(depth: int) -> bytes:
    return (
        b'{"model": "m", "messages": [{"content": "x"}], "x": ' + b"[" * depth + b"]" * depth + b"}"
    )


@pytest.mark.parametrize("depth", [MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 5])
def test_the_depth_shortcut_refuses_exactly_what_the_walk_refuses(depth: int) -> None:
    raw = _nested(depth)
    body = json.loads(raw)
    walked = admission._depth_ok(body)
    try:
        admission.parse_request(body, admission.CHAT, raw)
        refused = False
    except Refusal as refusal:
        refused = "nested" in refusal.message
    assert refused is not walked


def test_a_shallow_body_with_many_brackets_is_walked_and_accepted() -> None:
    # Brackets in strings and many sibling containers: over the shortcut's count, not
    # deep; the walk decides, and accepts.
    messages = [{"role": "user", "content": "[{" * 50} for _ in range(40)]
    body = {"model": "m", "messages": messages}
    raw = json.dumps(body).encode()
    assert not admission._shallow(raw)
    assert admission.parse_request(body, admission.CHAT, raw).messages == 40
