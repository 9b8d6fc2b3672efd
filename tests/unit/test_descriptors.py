"""The room the descriptor limit leaves the heartbeat listener (llmgw.api.runtime.descriptors)."""

from __future__ import annotations

import resource

from llmgw.api.runtime.descriptors import RESERVED, Room, room

INF = resource.RLIM_INFINITY


def test_the_soft_limit_is_raised_as_far_as_needed_and_allowed() -> None:
    # systemd's default: soft 1,024, hard 524,288: raised to fit every connection.
    assert room(10_000, 800, 1024, 524_288) == Room(10_000 + 800 + RESERVED, 10_000)
    # Already high enough: left as it is.
    assert room(10_000, 800, 1 << 20, 1 << 20) == Room(1 << 20, 10_000)
    assert room(10_000, 800, INF, INF) == Room(INF, 10_000)
    assert room(10_000, 800, 1024, INF) == Room(10_000 + 800 + RESERVED, 10_000)


def test_heartbeat_connections_are_held_to_what_the_hard_limit_leaves_beside_the_api() -> None:
    assert room(10_000, 800, 1024, 4096) == Room(4096, 4096 - 800 - RESERVED)
    assert room(10_000, 100, 600, 600) == Room(600, 600 - 100 - RESERVED)
    # No room at all: no heartbeat connection (agents send datagrams or full reports).
    assert room(10_000, 800, 1024, 1024) == Room(1024, 0)
