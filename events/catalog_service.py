"""The catalog of one database, to read and to change: the read model and the commands together.

What the CLI, the API and the daemon open: ``CatalogService(open_log(engine),
declared)`` keeps one read model (events.read.model: replay, snapshots, the
only catalog cache) and the command handlers (events.write.commands) over the same
log, with snapshots kept in the same database. (A log in memory is used with
the read model and the commands directly: tests/unit/events.)
"""

from __future__ import annotations

from collections.abc import Sequence

from catalog import Catalog, Model
from events.core.declared_change import DeclaredChange
from events.read.model import SNAPSHOT_EVERY, CatalogReadModel
from events.read.replay import Replayer, ReplayResult
from events.read.snapshots import SnapshotStore
from events.storage.sql_log import SqlLog
from events.write.apply import ApplyResult
from events.write.commands import CatalogCommands, CommandResult


class CatalogService:
    def __init__(
        self,
        store: SqlLog,
        declared: Catalog,
        config_path: str = "catalog.yaml",
        *,
        snapshot_every: int | None = SNAPSHOT_EVERY,
        snapshot_key: bytes | None = None,
        max_age: float = 0.0,
    ) -> None:
        self.store = store
        self.declared = declared
        self.config_path = config_path
        self.snapshots = SnapshotStore(store.engine, snapshot_key)
        self.read_model = CatalogReadModel(
            store,
            declared,
            config_path,
            snapshots=self.snapshots,
            snapshot_every=snapshot_every,
            max_age=max_age,
        )
        self.commands = CatalogCommands(store, self.read_model)

    # -- reading ----------------------------------------------------------

    def refresh(self) -> ReplayResult:
        """Catch up with the log; returns the replay as of its head."""
        return self.read_model.refresh()

    def catalog(self) -> Catalog:
        return self.read_model.catalog()

    @property
    def position(self) -> int:
        return self.read_model.position

    @property
    def replayer(self) -> Replayer:
        return self.read_model.replayer

    def snapshot(self) -> int | None:
        """Catch up and snapshot the replay state (events.read.model)."""
        return self.read_model.snapshot()

    def reload_declared(self, declared: Catalog) -> None:
        """Run with a new declared catalog from now on (a reloaded catalog.yaml)."""
        with self.read_model.lock:
            self.read_model.replace_declared(declared)
            self.commands.declared_changed()
            self.declared = declared

    def record_declared(self, change: DeclaredChange, *, actor: str, key: str) -> CommandResult:
        """Append ``catalog.declared_changed`` (once per ``key``)."""
        return self.commands.record_declared(change, actor=actor, key=key)

    # -- commands ---------------------------------------------------------

    def add(
        self, models: Sequence[Model], *, actor: str = "", reason: str = "", key: str | None = None
    ) -> CommandResult:
        return self.commands.add(models, actor=actor, reason=reason, key=key)

    def remove(
        self, name: str, *, actor: str = "", reason: str = "", key: str | None = None
    ) -> CommandResult:
        return self.commands.remove(name, actor=actor, reason=reason, key=key)

    def apply(
        self, model: Model, *, actor: str = "", reason: str = "", key: str | None = None
    ) -> ApplyResult:
        return self.commands.apply(model, actor=actor, reason=reason, key=key)
