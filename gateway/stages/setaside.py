"""Setting a failing replica aside for a short, growing while, and taking it back.

A replica that refused a connection, reset it, timed out or answered 5xx before the
first byte is set aside: no request is sent to it until the while is over. Each failure
in a row doubles the while (from ``BASE_S`` to at most ``MAX_S``); the first request
it answers clears the count. So a replica that restarted comes back within a second or
two, and one that stays down costs one probing request every half minute, not one in
three of all requests.

Pure: the clock is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.stages.routing import Load

BASE_S = 1.0
MAX_S = 30.0


@dataclass(slots=True)
class SetAside:
    failures: dict[str, int] = field(default_factory=dict)
    base_s: float = BASE_S
    max_s: float = MAX_S

    def failed(self, key: str, load: Load, now: float) -> float:
        """Record a failure of ``key``; the time it is set aside until."""
        n = self.failures.get(key, 0) + 1
        self.failures[key] = n
        load.set_aside_until = now + min(self.base_s * 2 ** (n - 1), self.max_s)
        return load.set_aside_until

    def answered(self, key: str, load: Load) -> None:
        """It answered: back in full."""
        if self.failures.pop(key, None) is not None:
            load.set_aside_until = 0.0

    def count(self, key: str) -> int:
        return self.failures.get(key, 0)
