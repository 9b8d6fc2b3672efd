"""The peer's own way to record a change: an ``eventsourcing`` application saving an aggregate.

``bench.events.peer`` measures the library's recorder alone (``insert_events`` of an
event already encoded), the reference issue 13 names. A user of the library
adding a model would write this instead: an aggregate per model, created with
its definition, and ``Application.save``, which builds the domain event, maps
and transcodes it to a stored event (JSON) and inserts it. That is the like-for-like
peer of a validated add (which also checks, encodes, hashes and applies the
definition); bench.events.append prints both.

Imported only when measured: eventsourcing is a bench-only dependency.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event


class CatalogModel(Aggregate):
    """One model of the catalog, created with its whole definition."""

    @event("Added")
    def __init__(self, definition: dict[str, Any]) -> None:
        self.definition = definition


class CatalogApp(Application[UUID]):
    """The library's application, on a SQLite file."""


def peer_application(path: Path) -> Any:
    """A ``CatalogApp`` on ``path``: the library's SQLite recorder (WAL), checked to run
    with ``synchronous=FULL`` (SQLite's default, which the library leaves alone) as ours does."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    app = CatalogApp(env={"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(path)})
    recorder: Any = app.recorder  # the SQLite recorder, whose datastore the base type hides
    with recorder.datastore.transaction(commit=False) as cursor:
        cursor.execute("PRAGMA synchronous")
        if cursor.fetchone()[0] != 2:
            raise AssertionError("the peer application's connection is not synchronous=FULL")
    return app
