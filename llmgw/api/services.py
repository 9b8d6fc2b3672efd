"""What the routes work with: the stores, and the catalog service behind one lock.

``CatalogService`` keeps replay state between calls (it reads only what was
appended since) and is not thread-safe, while FastAPI runs each request in a
worker thread. One long-lived service guarded by a lock keeps the cheap
incremental reads; a service per request would replay the log (or load a
snapshot) on every request.

Reads do not take the lock when nothing changed: the catalog is cached with
its log position, and a read first asks the log for its head (one indexed
query). Only when the log has moved does a reader take the lock and catch up.
A write updates the cache before it returns, so a client sees its own change.

Asking for the head costs more than the rest of a read (about a millisecond
through the pool, against 0.8 ms for the whole request without it), so it is
asked at most every ``max_age`` seconds (``--catalog-max-age``, default 0.1):
a change made through another process (a replica, the CLI) is served within
that, and never out of order. ``max_age=0`` asks on every read.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from catalog import Catalog, Model
from events import CatalogService, CommandResult, EventStore
from events.apply import ApplyResult
from events.db import is_sqlite
from llmgw.api.auth import TokenBook
from llmgw.api.metrics import Metrics
from llmgw.api.settings import ApiSettings
from scheduler.store import SchedulerStore


@dataclass(frozen=True, slots=True)
class CatalogView:
    """The catalog as of a log position, and how many events replay skipped."""

    position: int
    catalog: Catalog
    skipped: int


class CatalogGate:
    def __init__(
        self,
        service: CatalogService,
        metrics: Metrics,
        max_age: float = 0.1,
        writing: AbstractContextManager[Any] | None = None,
    ) -> None:
        self._service = service
        self._metrics = metrics
        self._max_age = max_age
        self._writing = writing or contextlib.nullcontext()
        self._lock = threading.Lock()
        self._view: CatalogView | None = None
        self._checked = 0.0  # time.monotonic() of the last look at the log's head

    def view(self) -> CatalogView:
        """The catalog as of the log's head, looked at within the last ``max_age`` seconds."""
        cached = self._view
        if cached is not None:
            now = time.monotonic()
            if now - self._checked < self._max_age:
                return cached
            if self._service.store.head() == cached.position:
                self._checked = now
                return cached
        with self._lock:
            return self._refresh()

    def _refresh(self) -> CatalogView:
        checked = time.monotonic()
        result = self._service.refresh()
        self._checked = checked
        cached = self._view
        if cached is not None and cached.position == result.position:
            return cached
        view = CatalogView(result.position, result.catalog, len(result.skipped))
        self._view = view
        self._metrics.catalog_position.set(view.position)
        self._metrics.events_skipped.set(view.skipped)
        return view

    def add(
        self, models: Sequence[Model], *, actor: str, reason: str, key: str | None
    ) -> CommandResult:
        with self._lock, self._writing:
            result = self._service.add(models, actor=actor, reason=reason, key=key)
            self._recorded(result)
            return result

    def apply(self, model: Model, *, actor: str, reason: str, key: str | None) -> ApplyResult:
        with self._lock, self._writing:
            result = self._service.apply(model, actor=actor, reason=reason, key=key)
            self._recorded(CommandResult(result.events, result.already_recorded, 0))
            return result

    def remove(self, name: str, *, actor: str, reason: str, key: str | None) -> CommandResult:
        with self._lock, self._writing:
            result = self._service.remove(name, actor=actor, reason=reason, key=key)
            self._recorded(result)
            return result

    def _recorded(self, result: CommandResult) -> None:
        if result.already_recorded:
            self._metrics.commands_repeated.inc()
        else:
            for event in result.events:
                self._metrics.events_appended.labels(event.type).inc()
        self._refresh()


@dataclass(frozen=True, slots=True)
class Services:
    engine: Engine
    store: EventStore
    gate: CatalogGate
    nodes: SchedulerStore
    declared: Catalog
    config_label: str
    settings: ApiSettings
    book: TokenBook
    metrics: Metrics
    # Set when the server starts shutting down: open event streams end.
    stopping: threading.Event
    # Held around this process's writes. On SQLite, one writer at a time holds the
    # database's lock and the others wait in SQLite's busy handler, which sleeps in
    # growing steps: under fifty concurrent agents some waited a second while others
    # came and went. Queueing here first is fair and keeps the tail short. (PostgreSQL
    # writers of node reports do not block each other: no lock.)
    writing: AbstractContextManager[Any]

    @classmethod
    def build(
        cls,
        engine: Engine,
        declared: Catalog,
        config_label: str,
        settings: ApiSettings,
        *,
        metrics: Metrics | None = None,
        stopping: threading.Event | None = None,
        snapshot_key: bytes | None = None,
    ) -> Services:
        store = EventStore(engine)
        metrics = metrics or Metrics()
        service = CatalogService(store, declared, config_label, snapshot_key=snapshot_key)
        writing: AbstractContextManager[Any] = (
            threading.Lock() if is_sqlite(engine) else contextlib.nullcontext()
        )
        return cls(
            engine=engine,
            store=store,
            gate=CatalogGate(service, metrics, settings.catalog_max_age_s, writing),
            nodes=SchedulerStore(engine),
            declared=declared,
            config_label=config_label,
            settings=settings,
            book=settings.book(),
            metrics=metrics,
            stopping=stopping or threading.Event(),
            writing=writing,
        )
