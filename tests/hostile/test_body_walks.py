"""A client token's body of millions of tiny containers (an 8 MiB chat body of empty
objects is 2.7 million of them) must not hold the gateway's event loop: every other
client, ``/healthz`` and a stop wait on it. What admission and the prefix router walk
of a body is either bounded or done off the loop."""

from __future__ import annotations

import time
from typing import Any

from gateway.server import GatewayApp
from gateway.stages import prefix
from tests.unit.gateway.test_app_answers import CHAT, _call, _run

# An 8 MiB chat body, compact: a message, then empty objects (three bytes each).
_EMPTIES = (8 << 20) // 3 - 100


def _flat_body() -> bytes:
    return (
        b'{"model": "other", "messages": [{"role": "user", "content": "hi"}'
        + b",{}" * _EMPTIES
        + b"]}"
    )


def test_a_body_of_millions_of_empty_objects_does_not_hold_the_event_loop() -> None:
    # Admission's depth check walked every container of the body in Python, on the
    # event loop (the decoding itself runs in a worker thread): 2.7 to 3.2 s of CPU for
    # this body on the loaded 2-core machine, every other request, /healthz and a stop
    # held that long, and a client sending a few at once held the loop for good.
    body = _flat_body()
    assert len(body) <= 8 << 20

    async def test(app: GatewayApp) -> None:
        # The event loop's own CPU (its thread's), not a wall-clock pause: a worker
        # thread's decoding holds the GIL in long C calls, more so on a loaded machine.
        before = time.thread_time()
        answer = await _call(app, "POST", CHAT, body)
        spent = time.thread_time() - before
        assert answer.status in (400, 503), answer.body[:300]
        assert spent < 0.3, f"the event loop spent {spent:.2f} s of CPU on the body"

    _run(test)


class _Counted(list[Any]):
    """A list that counts the items read from it."""

    read = 0

    def __iter__(self) -> Any:
        for item in super().__iter__():
            self.read += 1
            yield item


def test_the_prefix_router_reads_no_more_messages_than_it_hashes() -> None:
    # The prefix profile's prompt built a text for every message of the body before
    # keeping only the first MAX_BLOCKS blocks (each message starts one): 350 ms on the
    # event loop for a body of 2.7 million empty messages.
    messages = _Counted([{"role": "user", "content": "x"}] + [{}] * 100_000)
    found = prefix.prompt_of({"messages": messages}, "chat")
    assert found is not None and len(found.blocks) == prefix.MAX_BLOCKS
    assert messages.read <= prefix.MAX_BLOCKS
    # A message of many parts: only those that can reach the blocks hashed are read.
    parts = _Counted([{"type": "text", "text": ""}] * 300_000)
    one = prefix.prompt_of({"messages": [{"role": "user", "content": parts}]}, "chat")
    assert one is not None and len(one.blocks) == prefix.MAX_BLOCKS
    assert parts.read <= prefix.MAX_BLOCKS * prefix.BLOCK_CHARS + 1
