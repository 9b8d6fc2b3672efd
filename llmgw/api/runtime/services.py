"""What the routes work with: the stores, and the catalog behind the read model.

The catalog is read and changed through one ``CatalogService`` (events.catalog_service):
its read model keeps replay state between calls (it reads only what was appended
since) and is the only cache of the catalog, guarded by its own lock, while
FastAPI runs each request in a worker thread. Reads do not take the lock when
nothing changed (see events.read.model): the log's head is asked at most every
``max_age`` seconds (``--catalog-max-age``, default 0.1), so a change made through
another process (a replica, the CLI) is served within that, and never out of
order; ``max_age=0`` asks on every read. A write updates the cache before it
returns, so a client sees its own change. ``CatalogGate`` adds only what is the
API's: the metrics, and queueing this process's writes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from catalog import Catalog, Model
from declared.reload import DeclaredReloader
from events.catalog_service import CatalogService
from events.database.connection import is_sqlite
from events.read.model import CatalogView
from events.storage.backends import open_log
from events.storage.sql_log import SqlLog
from events.write.apply import ApplyResult
from events.write.commands import CommandResult
from llmgw.api.guards.tokens import TokenBook
from llmgw.api.rendering.openai import CreatedIndex
from llmgw.api.reports.group_commit import GroupCommit
from llmgw.api.reports.leases import LeaseBook
from llmgw.api.reports.node_reports import Recorded, Sent, node_report_writer
from llmgw.api.runtime.changes import Changes
from llmgw.api.runtime.live_tokens import LiveTokens
from llmgw.api.runtime.settings import ApiSettings
from llmgw.api.telemetry.metrics import Metrics
from llmgw.views import iso
from scheduler.persistence.store import SchedulerStore


class CatalogGate:
    """The catalog service as the routes use it: counted in the metrics, writes queued."""

    def __init__(
        self,
        service: CatalogService,
        metrics: Metrics,
        writing: AbstractContextManager[Any] | None = None,
    ) -> None:
        self._service = service
        self._model = service.read_model
        self._metrics = metrics
        self._writing = writing or contextlib.nullcontext()
        self._shown: CatalogView | None = None

    def view(self) -> CatalogView:
        """The catalog as of the log's head, looked at within the last ``max_age`` seconds."""
        view = self._model.view()
        if view is not self._shown:
            self._shown = view
            self._metrics.catalog_position.set(view.position)
            self._metrics.events_skipped.set(view.skipped)
        return view

    @property
    def service(self) -> CatalogService:
        return self._service

    @property
    def declared(self) -> Catalog:
        """The declared catalog in force (it changes when the file is reloaded)."""
        return self._service.declared

    def add(
        self, models: Sequence[Model], *, actor: str, reason: str, key: str | None
    ) -> CommandResult:
        with self._model.lock, self._writing:
            result = self._service.add(models, actor=actor, reason=reason, key=key)
        self._recorded(result)
        return result

    def apply(self, model: Model, *, actor: str, reason: str, key: str | None) -> ApplyResult:
        with self._model.lock, self._writing:
            result = self._service.apply(model, actor=actor, reason=reason, key=key)
        self._recorded(CommandResult(result.events, result.already_recorded, 0))
        return result

    def remove(self, name: str, *, actor: str, reason: str, key: str | None) -> CommandResult:
        with self._model.lock, self._writing:
            result = self._service.remove(name, actor=actor, reason=reason, key=key)
        self._recorded(result)
        return result

    def _recorded(self, result: CommandResult) -> None:
        if result.already_recorded:
            self._metrics.commands_repeated.inc()
        else:
            for event in result.events:
                self._metrics.events_appended.labels(event.type).inc()
        self.view()


class DeclaredWatch:
    """The declared file's reloader, once ``llmgw serve`` has one (None: no file given)."""

    def __init__(self) -> None:
        self.reloader: DeclaredReloader | None = None

    def to_json(self) -> dict[str, Any] | None:
        """What ``/readyz`` and ``/v1/fleet`` say of the declared file (None: none watched)."""
        reloader = self.reloader
        if reloader is None:
            return None
        last = reloader.last
        return {
            "path": str(reloader.path),
            "state": "refused" if last.refusal is not None else "loaded",
            "digest": last.digest,
            "checked_at": None if last.at is None else iso(last.at),
            "refusal": None if last.refusal is None else last.refusal.to_json(),
        }


@dataclass(frozen=True, slots=True)
class Services:
    engine: Engine
    store: SqlLog
    gate: CatalogGate
    nodes: SchedulerStore
    declared: Catalog
    config_label: str
    settings: ApiSettings
    # The tokens configured at start and the database's, kept current (live_tokens).
    tokens: LiveTokens
    metrics: Metrics
    # Set when the server starts shutting down: open event streams end.
    stopping: threading.Event
    # Held around this process's writes. On SQLite, one writer at a time holds the
    # database's lock and the others wait in SQLite's busy handler, which sleeps in
    # growing steps: under fifty concurrent agents some waited a second while others
    # came and went. Queueing here first is fair and keeps the tail short. (PostgreSQL
    # writers of node reports do not block each other: no lock.)
    writing: AbstractContextManager[Any]
    # When each runtime model was added, for OpenAI's `created` (llmgw.api.rendering.openai).
    created: CreatedIndex
    # Agents' node reports, committed in shared transactions (llmgw.api.reports.node_reports).
    reports: GroupCommit[Sent, Recorded]
    # Node leases renewed by heartbeats, written a batch a second (llmgw.api.reports.leases).
    leases: LeaseBook
    # The declared file's reloader (llmgw serve sets it; declared.reload).
    declared_watch: DeclaredWatch = field(default_factory=DeclaredWatch)
    # Wake-ups on a write by any process (PostgreSQL's NOTIFY; llmgw.api.runtime.changes).
    changes: Changes = field(default_factory=Changes)

    @property
    def book(self) -> TokenBook:
        """The tokens in force now: a request's check never waits on the database."""
        return self.tokens.book

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
        store = open_log(engine)
        metrics = metrics or Metrics()
        service = CatalogService(
            store,
            declared,
            config_label,
            snapshot_key=snapshot_key,
            max_age=settings.catalog_max_age_s,
        )
        nodes = SchedulerStore(engine)
        tokens = LiveTokens(settings.tokens, engine)
        tokens.first_refresh()  # the table's tokens work from the first request
        writing: AbstractContextManager[Any] = (
            threading.Lock() if is_sqlite(engine) else contextlib.nullcontext()
        )
        leases = LeaseBook(nodes, writing, metrics)
        return cls(
            engine=engine,
            store=store,
            gate=CatalogGate(service, metrics, writing),
            nodes=nodes,
            declared=declared,
            config_label=config_label,
            settings=settings,
            tokens=tokens,
            metrics=metrics,
            stopping=stopping or threading.Event(),
            writing=writing,
            created=CreatedIndex(store),
            reports=node_report_writer(nodes, writing, metrics, settings.endpoints, leases),
            leases=leases,
        )
