"""Every finished request's usage, counted in memory until the next flush.

Pure: the wall-clock time is passed in. One ``Ledger`` per gateway process counts, per
(client token, model asked, model served, replica, minute), the requests by outcome
and their tokens: the engine's own ``usage`` when it gave it, else what the gateway
counted (``estimated``: a stream cut before the engine's usage event). ``take`` hands
the counts over as rows for one flush (gateway.ledger posts them to the control
plane, which appends each row to the log as a ``usage.recorded`` event,
events.core.usage) and starts counting afresh. Nothing of a prompt or an answer is
kept: names and counts.

A control plane out of reach leaves the counts here, merged minute by minute, until a
flush goes through; at most ``MAX_KEYS`` keys are held (a day of a thousand clients'
traffic on a few models), and what comes beyond is counted in ``dropped`` and named in
the log (``gateway.usage_dropped``) rather than growing without bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

MAX_KEYS = 200_000
MINUTE_S = 60
# The most a row's count may be: what the control plane takes (events.core.usage
# MAX_COUNT), which refuses the whole flush for one count above it. The counts are the
# engines' word (up to 12 digits each, gateway.usage): a thousand answers of a hostile
# engine in one minute of one key went past it, and the flush carrying every client's
# rows of that tick was refused and dropped. A count is held at this bound instead.
MAX_COUNT = 10**15


@dataclass(slots=True)
class Counts:
    requests: int = 0
    prompt: int = 0
    cached: int = 0
    completion: int = 0
    estimated: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


# (client, model asked, model served or None, replica or None, minute as epoch seconds)
Key = tuple[str, str, str | None, str | None, int]


class Ledger:
    """This process's counts since the last ``take``."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.counts: dict[Key, Counts] = {}
        self.max_keys = max_keys
        # Requests not counted since the last ``take`` (the table was full).
        self.dropped = 0
        # Requests counted since this process started (for its log line at a stop).
        self.recorded = 0

    def record(
        self,
        client: str,
        model: str,
        served: str | None,
        replica: str | None,
        outcome: str,
        *,
        tokens: tuple[int, int, int] | None,
        estimated: bool,
        now: float,
    ) -> None:
        """One finished request: ``tokens`` (prompt, cached, completion) or None (none
        used: nothing was sent); ``estimated`` when they are the gateway's count, not
        the engine's; ``now`` the wall-clock time it finished (seconds since the epoch)."""
        if served is None or replica is None:
            served = replica = None
        key = (client, model, served, replica, int(now // MINUTE_S) * MINUTE_S)
        found = self.counts.get(key)
        if found is None:
            if len(self.counts) >= self.max_keys:
                self.dropped += 1
                return
            found = self.counts[key] = Counts()
        found.requests += 1
        self.recorded += 1
        found.outcomes[outcome] = found.outcomes.get(outcome, 0) + 1
        if tokens is not None:
            prompt, cached, completion = tokens
            found.prompt = min(found.prompt + prompt, MAX_COUNT)
            # Cached tokens are part of the prompt's (an engine that says otherwise is
            # held to it).
            found.cached = min(found.cached + min(cached, prompt), found.prompt)
            found.completion = min(found.completion + completion, MAX_COUNT)
        if estimated:
            found.estimated += 1

    def take(self) -> list[dict[str, Any]]:
        """The counts as rows (``usage.recorded`` payloads without ``gateway`` and
        ``flush``, which the control plane stamps), oldest minute first; the ledger is
        empty after."""
        taken, self.counts = self.counts, {}
        self.dropped = 0
        rows = []
        for (client, model, served, replica, minute), c in sorted(
            taken.items(), key=lambda item: (item[0][4], item[0][0], item[0][1])
        ):
            rows.append(
                {
                    "minute": _minute_text(minute),
                    "client": client,
                    "model": model,
                    "served": served,
                    "replica": replica,
                    "requests": c.requests,
                    "outcomes": c.outcomes,
                    "prompt_tokens": c.prompt,
                    "cached_tokens": c.cached,
                    "completion_tokens": c.completion,
                    "estimated": c.estimated,
                }
            )
        return rows

    def __len__(self) -> int:
        return len(self.counts)


def _minute_text(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:00Z", time.gmtime(epoch))
