"""The threads that keep a server's view of other processes' writes current: the token
check's refresh (every ``REFRESH_S``) and, on PostgreSQL, the listener that wakes it and
the event streams as soon as a write commits (llmgw.api.runtime.changes)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from llmgw.api.runtime.changes import ChangeListener
from llmgw.api.runtime.live_tokens import TokenRefresher
from llmgw.api.runtime.services import Services


@dataclass(frozen=True, slots=True)
class Watching:
    refresher: TokenRefresher
    listener: ChangeListener | None

    def stop(self) -> None:
        if self.listener is not None:
            self.listener.stop()
        self.refresher.stop()


def _count(services: Services, source: str) -> int:
    return services.tokens.counts()[source]


def watch_changes(services: Services) -> Watching:
    """Start the threads for ``services``; ``stop`` them when the server stops."""
    refresher = TokenRefresher(services.tokens)
    # Only the log's inserts can change the token table (each change is an event).
    services.changes.subscribe(
        lambda table: refresher.wake.set() if table != "placement_events" else None
    )
    refresher.start()
    metrics = services.metrics
    for source in ("database", "configured"):
        metrics.tokens.labels(source).set_function(partial(_count, services, source))
    metrics.change_notifications.set(0)
    listener = None
    if services.engine.dialect.name == "postgresql":
        listener = ChangeListener(
            services.engine,
            services.changes,
            on_listening=lambda up: metrics.change_notifications.set(1 if up else 0),
        )
        listener.start()
    return Watching(refresher, listener)
