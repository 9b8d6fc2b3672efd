"""The gateway's own header lines (``Proxy._head``) are written into an answer's head
unchecked by the server (``httpguard.protocol.RequestHooks.start``): whatever the control
plane's feed holds, they must be lines uvicorn's own checks would have passed, or a
replica's entry in the feed could split the answer (a header of its own, a body)."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from catalog.definition.parse import parse_model
from gateway.proxy import OWN_HEAD, STREAM_HEAD
from gateway.stages.head import pairs
from gateway.table import build

# uvicorn's (uvicorn.protocols.http.httptools_impl): what a header name and value must not hold.
HEADER_NAME_BAD = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
HEADER_VALUE_BAD = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")

NAMES = st.from_regex(r"[A-Za-z0-9](?:[A-Za-z0-9._:/-]{0,30}[A-Za-z0-9])?", fullmatch=True)
ANYTHING = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
)


def _safe(head: bytes) -> None:
    assert head.endswith(b"\r\n") and b"\r\n\r\n" not in head
    for name, value in pairs(head):
        assert not HEADER_NAME_BAD.search(name), name
        assert not HEADER_VALUE_BAD.search(value), value


@given(name=NAMES, replica=ANYTHING)
def test_any_feed_entry_makes_replica_keys_safe_in_the_gateways_own_lines(
    name: str, replica: Any
) -> None:
    m = parse_model(
        {"name": name, "source": "org/x", "profiles": [{"name": "p", "gpu_class": "a100"}]}
    )
    entry = {"model": name, "replica": replica, "state": "ready", "endpoint": "http://h:1",
             "profile": "p"}  # fmt: skip
    ready = build([m], [entry], 1).ready.get(name, ())
    # Only a whole number not below zero names a replica; anything else is not served.
    served = isinstance(replica, int) and not isinstance(replica, bool) and replica >= 0
    assert [r.key for r in ready] == ([f"{name}/{replica}"] if served else [])
    for r in ready:
        head = OWN_HEAD % (name.encode(), r.key.encode(), 12.345, b"0123abcd00000001")
        _safe(head + STREAM_HEAD)
