"""How long the scheduler's leadership lease lasts: pure, so settings can say it cheaply."""

from __future__ import annotations

# The shortest leadership lease: a busy machine pauses a process for a good part of a
# second now and then, and a lease shorter than that would change hands for nothing.
MIN_LEASE_S = 2.0
# The lease, in rounds, when it is not set: a leader may miss one renewal, and a
# replica that waits one round more takes over within three intervals of the last renewal.
LEASE_ROUNDS = 2


def lease_seconds(interval_s: float, configured_s: float | None = None) -> float:
    """The leadership lease: as configured, else twice the round interval, at least 2 s."""
    if configured_s is not None:
        return configured_s
    return max(MIN_LEASE_S, LEASE_ROUNDS * interval_s)
