"""Being told at once that another process wrote: PostgreSQL's LISTEN/NOTIFY.

On PostgreSQL every insert into the catalog's log or the placement log sends
``NOTIFY llmgw_changes`` (a trigger, migration 0013), delivered when the writing
transaction commits, whoever wrote: this replica, another one, the CLI, the scheduler.
``ChangeListener`` holds one connection of its own that LISTENs, and passes each
notification to ``Changes``, which wakes the event streams of this process (they then
read the log at once instead of at their next poll) and calls its callbacks (the token
check's refresh). A write through another replica thus reaches a watch here within a
few milliseconds rather than within the stream's poll.

The poll stays: when the listening connection is down (or on SQLite, which has no
notifications) every waiter still looks every ``stream_poll`` as before. After the
connection comes back, everyone is woken once, for what was written meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import structlog
from sqlalchemy import Engine

log = structlog.get_logger("llmgw.api")

CHANNEL = "llmgw_changes"
# The longest pause between two attempts to listen again after the connection failed.
MAX_PAUSE_S = 5.0
# How long one wait for notifications lasts before the thread looks whether to stop.
WAIT_S = 0.5


class Changes:
    """Wake-ups for whatever waits on a change of the logs (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._callbacks: list[Callable[[str], None]] = []
        # Counts notifications: a waiter that read the logs at generation N and waits
        # with ``seen=N`` returns at once if one came in between, rather than miss it.
        self.generation = 0

    def subscribe(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(table)`` on every notification, from the listener's thread."""
        self._callbacks.append(callback)

    def notify(self, table: str) -> None:
        with self._lock:
            self.generation += 1
            waiters = list(self._waiters)
        for callback in self._callbacks:
            callback(table)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # a closed loop: its waiter went with it
                loop.call_soon_threadsafe(event.set)

    async def wait(self, timeout: float, seen: int) -> None:
        """Until a notification after generation ``seen``, or ``timeout`` seconds."""
        if self.generation != seen:
            return
        event = asyncio.Event()
        waiter = (asyncio.get_running_loop(), event)
        with self._lock:
            if self.generation != seen:
                return
            self._waiters.add(waiter)
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                self._waiters.discard(waiter)


class ChangeListener:
    """A thread listening on ``CHANNEL`` on a connection of its own (PostgreSQL only)."""

    def __init__(
        self,
        engine: Engine,
        changes: Changes,
        on_listening: Callable[[bool], None] = lambda listening: None,
    ) -> None:
        self.engine = engine
        self.changes = changes
        self.on_listening = on_listening
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmgw-listen", daemon=True)
        self.listening = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(WAIT_S + 5)

    def _connect(self) -> Any:
        # The engine's own connect arguments (keepalives, timeouts), on a connection
        # taken out of its pool for good: it stays in LISTEN for the process's life.
        raw = self.engine.raw_connection()
        raw.detach()
        conn: Any = raw.dbapi_connection
        conn.rollback()
        conn.autocommit = True
        conn.execute(f"LISTEN {CHANNEL}")
        return conn

    def _run(self) -> None:
        pause = 0.2
        lost = False
        while not self._stop.is_set():
            conn = None
            try:
                conn = self._connect()
                self.listening.set()
                self.on_listening(True)
                if lost:
                    log.info("api.listen_back", channel=CHANNEL)
                    lost = False
                pause = 0.2
                self.changes.notify("*")  # whatever was written while not listening
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=WAIT_S):
                        self.changes.notify(str(note.payload))
            except Exception as exc:  # any failure means the same: listen again, poll meanwhile
                self.listening.clear()
                self.on_listening(False)
                if not lost:
                    lost = True
                    log.warning(
                        "api.listen_failed",
                        channel=CHANNEL,
                        error=f"{type(exc).__name__}: {exc}"[:300],
                        detail="event streams and token checks poll until it is back",
                    )
                self._stop.wait(pause)
                pause = min(pause * 2, MAX_PAUSE_S)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
