"""A gateway's flush of usage counts, appended to the log: one ``usage.recorded`` event
a row (events.core.usage), all or none, under the flush's id as the command key.

The key is ``usage:<poster>:<flush>``: the same flush sent again (its answer lost, a
timeout) returns the events first written and appends nothing, so a retried flush is
never counted twice; another gateway's flush ids cannot collide with it (the poster is
the gateway token's name and worker, never the body's). A flush is a gateway's own,
checked by the route before it comes here: nothing is judged against the catalog.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from events.core.usage import UsageRow, event_for
from events.storage.log import AppendOutcome, Log


def flush_key(poster: str, flush: str) -> str:
    return f"usage:{poster}:{flush}"


def record_usage(log: Log, poster: str, flush: str, rows: Sequence[UsageRow]) -> AppendOutcome:
    """Append ``rows`` (each stamped with ``poster`` and ``flush``) under the flush's key."""
    stamped = [replace(row, gateway=poster, flush=flush) for row in rows]
    return log.append(
        [event_for(row) for row in stamped],
        expected_head=None,
        actor=poster,
        key=flush_key(poster, flush),
    )
