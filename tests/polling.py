"""How often the tests' waits look again (``tests.e2e.agents.eventually`` and the like)."""

from __future__ import annotations


def poll_interval(waited: float) -> float:
    """Seconds to sleep before the next look, once a wait has gone on ``waited`` seconds:
    50 ms, growing by a tenth of the time waited, to 250 ms after two seconds.

    A look is mostly a request to a server (~7 ms of CPU with its answer) or a forked
    command, and ten a second through a wait of a minute on an engine or a rollout were
    seconds of CPU for nothing; a condition met late in a long wait is seen a little later.
    """
    return min(0.05 + waited / 10, 0.25)
