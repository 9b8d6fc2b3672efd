"""Reading older event payloads as the current version, without rewriting stored rows.

When a payload's shape changes, its type's version in ``CURRENT_SCHEMA`` goes
up and a function from the old shape to the next one is registered here.
Replay applies them in order, so a log written by any earlier release reads
as if written today, and the stored history stays exactly what was recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from events.core.types import CURRENT_SCHEMA, MODEL_ADDED, USAGE_RECORDED

Payload = dict[str, Any]


def _added_v1_to_v2(payload: Payload) -> Payload:
    """v1 did not record the declared catalog an add was validated against: unknown."""
    return {**payload, "declared_digest": None}


def _usage_v1_to_v2(payload: Payload) -> Payload:
    """v1 was one flush's row (``gateway``, ``flush``); v2 sums flushes (``gateways``,
    ``flushes``): a v1 row is one flush of one gateway. Anything not a v1 row is left
    for the reader to name."""
    if not isinstance(payload, dict) or "gateways" in payload or "flushes" in payload:
        return payload
    out = {k: v for k, v in payload.items() if k not in ("gateway", "flush")}
    return {**out, "gateways": [payload["gateway"]] if "gateway" in payload else None, "flushes": 1}


# (type, from_version) -> function giving the payload at from_version + 1
UPCASTERS: dict[tuple[str, int], Callable[[Payload], Payload]] = {
    (MODEL_ADDED, 1): _added_v1_to_v2,
    (USAGE_RECORDED, 1): _usage_v1_to_v2,
}


class UnreadableEvent(Exception):
    """An event this code cannot interpret; replay skips it with this reason."""


def upcast(event_type: str, version: int, payload: Payload) -> Payload:
    current = CURRENT_SCHEMA.get(event_type)
    if current is None:
        raise UnreadableEvent(
            f"unknown event type {event_type!r}; it may have been written by a newer llmgw"
        )
    if version > current:
        raise UnreadableEvent(
            f"schema_version {version} of {event_type!r} is newer than this code reads "
            f"({current}); upgrade llmgw to read it"
        )
    if version < 1:
        raise UnreadableEvent(f"schema_version {version} of {event_type!r} is not a version")
    while version < current:
        step = UPCASTERS.get((event_type, version))
        if step is None:
            raise UnreadableEvent(f"no upcaster for {event_type!r} version {version}")
        payload = step(payload)
        version += 1
    return payload
