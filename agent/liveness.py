"""Whether the agent's process ran: a time it was frozen (SIGSTOP, a paused VM, a
suspended laptop), told apart from a time spent waiting.

A thread of its own beats every ``BEAT_S``; a time between two beats longer than
``stall_s`` is a time the process did not run at all (a thread that sleeps half a second
is not late by seconds otherwise: the GIL is handed over every few milliseconds). The
loop's own clock cannot tell it: a tick that waited on a slow control plane (a report
that took its timeout, then went through) and a tick frozen in the middle look the same
from a clock read at its start and end. The agent holds its engines after a freeze (the
control plane may have given the node up meanwhile: ``agent.runtime``), not after a
wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# How often the thread beats (seconds).
BEAT_S = 0.5


class Liveness:
    def __init__(self, stall_s: float, clock: Callable[[], float] = time.time) -> None:
        # (Never within two beats: a late beat is not a stall.)
        self.stall_s = max(stall_s, 2 * BEAT_S)
        self.clock = clock
        self._last: float | None = None
        # When the last stall was seen to end (the agent's clock), if ever.
        self._stalled_at: float | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.beat()
        self._thread = threading.Thread(target=self._run, name="llmgw-agent-liveness", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            self.beat()

    def beat(self) -> None:
        # Under a lock: the thread and the main one (``stalled_since``) both beat, and a
        # beat that read the clock before a freeze must not write it after another's.
        with self._lock:
            now = self.clock()
            last = self._last
            if last is not None and now - last > self.stall_s:
                self._stalled_at = now
            self._last = now

    def stalled_since(self, since: float) -> bool:
        """Whether the process stood still for more than ``stall_s`` at some time after
        ``since``: a stall seen by a beat after it. The look is a beat itself: a stall
        under way (the thread not yet run since the thaw) is seen, and ended, now; the
        thread's own late beat then sees no second one after a contact made since (it
        did, when it ran after the main thread: one freeze was two times away)."""
        self.beat()
        stalled_at = self._stalled_at
        return stalled_at is not None and stalled_at > since
