"""The write side: add and remove models, each checked against the whole resulting catalog.

The whole catalog is built before anything is written: a model naming a
missing fallback, colliding with another, or malformed is refused rather than
persisted and then skipped forever after. A model that looks added and never
appears is the worst outcome available.

A command validates and appends holding the log's write lock: it catches up
on what other writers appended, validates against that head and appends in
the same transaction, so concurrent writers queue instead of racing and none
gives up. A retried command with the same key is recorded once.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import structlog
from sqlalchemy.exc import SQLAlchemyError

from catalog import Catalog, CatalogError, Model
from catalog.diff import FieldChange, diff_models
from catalog.digest import catalog_digest
from catalog.identifiers import check_command
from events.apply import (
    ApplyPlan,
    ApplyResult,
    definition_event,
    outcome_of,
    plan_apply,
    same_definition,
)
from events.idempotency import change_digest, recorded_change
from events.replay import Replayer, ReplayResult
from events.snapshots import SnapshotStore
from events.store import EventStore, UnvouchedRow
from events.timetravel import catalog_at
from events.types import MODEL_ADDED, MODEL_REMOVED, NewEvent, StoredEvent

Same = Callable[[tuple[StoredEvent, ...]], bool]

log = structlog.get_logger("llmgw.catalog")

# A snapshot is taken after catching up on this many events (replay runs at
# roughly 10,000 events a second, so a start-up never replays much more than
# a fifth of a second before restoring), and whenever a snapshot was ignored.
SNAPSHOT_EVERY = 2_000


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cycle collector while catching up with the log.

    Replay allocates many objects that all live on (the catalog's models), so
    the collector runs again and again over a growing heap and finds nothing:
    about a quarter of a start-up's replay. Replay makes no reference cycles
    worth collecting mid-way; the collector resumes (if it was running) when
    the catch-up ends, however it ends.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class CommandConflict(Exception):
    """The log could not take a command (its last row is not vouched for by the
    chain); nothing was written."""


class KeyReused(CatalogError):
    """An idempotency key was sent again with a different change."""


@dataclass(frozen=True, slots=True)
class CommandResult:
    events: tuple[StoredEvent, ...]
    already_recorded: bool
    attempts: int

    @property
    def positions(self) -> list[int]:
        return [e.position for e in self.events]


class CatalogService:
    """The catalog as of the log's head, and the commands that change it.

    Keeps its replay state between calls and only reads what was appended
    since, so a long-lived process (the daemon, an API server, a benchmark)
    pays for each event once. The first refresh starts from the newest usable
    snapshot (events.snapshots) rather than from the beginning of the log, and
    a refresh that caught up on ``snapshot_every`` events or more takes a new
    one (``snapshot_every=None``: never), under ``snapshot_key`` when given
    (events.snapshots). A ``ReplayResult`` from a service
    restored from a snapshot lists only the events after it.
    """

    def __init__(
        self,
        store: EventStore,
        declared: Catalog,
        config_path: str = "catalog.yaml",
        *,
        snapshot_every: int | None = SNAPSHOT_EVERY,
        snapshot_key: bytes | None = None,
    ):
        self.store = store
        self.declared = declared
        self.config_path = config_path
        self.declared_digest = catalog_digest(declared)
        self.snapshots = SnapshotStore(store.engine, snapshot_key)
        self.snapshot_every = snapshot_every
        self._replayer = Replayer.start(declared, config_path)
        self._started = False
        self._since_snapshot = 0
        self._replace_snapshot = False

    def refresh(self) -> ReplayResult:
        """Catch up with the log; returns the replay as of its head."""
        self._sync()
        return self._replayer.result()

    def _sync(self) -> None:
        """Catch up with the log (and snapshot when due) without building a result:
        a result copies the position of every event replayed so far, which the
        commands, called once per add, have no use for."""
        self._catch_up()
        if self.snapshot_every is not None and (
            self._since_snapshot >= self.snapshot_every
            or (self._replace_snapshot and self._since_snapshot > 0)
        ):
            self._save_snapshot()

    def _catch_up(self) -> None:
        if not self._started:
            self._started = True
            self._restore()
        with gc_paused():
            self._apply_new()

    def _apply_new(self) -> None:
        self._apply(self.store.read(after=self._replayer.position))

    def _apply(self, events: Iterable[StoredEvent]) -> None:
        for event in events:
            self._since_snapshot += 1
            skipped = self._replayer.apply(event)
            if skipped is not None:
                log.warning(
                    "catalog.event_skipped",
                    position=skipped.position,
                    event_id=skipped.event_id,
                    type=skipped.type,
                    reason=skipped.reason,
                )

    def _restore(self) -> None:
        if self.snapshot_every is None:
            return
        try:
            restored = self.snapshots.load(self.declared, self.config_path)
        except SQLAlchemyError as exc:  # e.g. a database not yet migrated to snapshots
            log.warning("catalog.snapshot_ignored", reason=f"cannot read snapshots: {exc}")
            return
        if restored.replayer is not None:
            self._replayer = restored.replayer
        self._replace_snapshot = restored.ignored

    def snapshot(self) -> int | None:
        """Catch up and store the replay state as of the head; the snapshot's id, or None
        if the database refused (a read-only replica, a lock held too long): nothing
        depends on it."""
        self._catch_up()
        return self._save_snapshot()

    def _save_snapshot(self) -> int | None:
        try:
            info = self.snapshots.save(self._replayer, self.declared)
        except SQLAlchemyError as exc:
            log.warning("catalog.snapshot_failed", position=self.position, error=str(exc))
            return None
        self._since_snapshot = 0
        self._replace_snapshot = False
        return info.id

    def catalog(self) -> Catalog:
        self._sync()
        return self._replayer.state.snapshot()

    @property
    def position(self) -> int:
        return self._replayer.position

    # -- commands ---------------------------------------------------------

    def add(
        self,
        models: Sequence[Model],
        *,
        actor: str = "",
        reason: str = "",
        key: str | None = None,
    ) -> CommandResult:
        """Add one model or a list, all or nothing."""
        if not models:
            raise CatalogError("nothing to add: the definition holds no model")

        def build() -> list[NewEvent]:
            ordered = self._replayer.state.check_add(models)
            return [definition_event(MODEL_ADDED, m, self.declared_digest) for m in ordered]

        names = [m.name for m in models]
        change = change_digest(MODEL_ADDED, [m.to_definition() for m in models])
        return self._run(MODEL_ADDED, names, change, build, actor=actor, reason=reason, key=key)

    def remove(
        self, name: str, *, actor: str = "", reason: str = "", key: str | None = None
    ) -> CommandResult:
        def build() -> list[NewEvent]:
            self._replayer.state.check_remove(name)
            return [NewEvent(type=MODEL_REMOVED, model=name, payload=json.dumps({"name": name}))]

        change = change_digest(MODEL_REMOVED, [name])
        return self._run(MODEL_REMOVED, [name], change, build, actor=actor, reason=reason, key=key)

    def apply(
        self, model: Model, *, actor: str = "", reason: str = "", key: str | None = None
    ) -> ApplyResult:
        """Add ``model``, or replace the runtime model of its name with it in one event
        (events.apply); nothing is written when the catalog already holds it."""
        plans: list[ApplyPlan] = []

        def build() -> list[NewEvent]:
            plans.append(plan_apply(self._replayer.state, model, self.declared_digest))
            return list(plans[-1].events)

        def same(previous: tuple[StoredEvent, ...]) -> bool:
            return same_definition(previous, model)

        change = change_digest("model.apply", [model.to_definition()])
        result = self._run(
            "model.apply",
            [model.name],
            change,
            build,
            actor=actor,
            reason=reason,
            key=key,
            same=same,
        )
        if result.already_recorded:
            return self._first_apply(model, result.events)
        plan = plans[-1]  # the attempt that was appended (or found nothing to do)
        if plan.outcome == "unchanged":
            log.info("catalog.apply_unchanged", model=model.name, actor=actor)
        return ApplyResult(plan.outcome, model.name, plan.changes, result.events, False)

    def _first_apply(self, model: Model, events: tuple[StoredEvent, ...]) -> ApplyResult:
        """A repeated key's first outcome, its changes read from the log as they were."""
        (event,) = events
        outcome = outcome_of(event)
        changes: tuple[FieldChange, ...] = ()
        if outcome == "replaced":
            _, before = catalog_at(
                self.store,
                self.declared,
                event.position - 1,
                config_path=self.config_path,
                snapshots=self.snapshots,
            )
            old = before.resolve(model.name)
            changes = diff_models(old, model) if old is not None else ()
        return ApplyResult(outcome, model.name, changes, events, True)

    def _run(
        self,
        command: str,
        names: list[str],
        change: str,
        build: Callable[[], list[NewEvent]],
        *,
        actor: str,
        reason: str,
        key: str | None,
        same: Same | None = None,
    ) -> CommandResult:
        # Who, why and the key are recorded beside the events and printed by
        # `history`: the same grammar for every path (CLI, API, a token's name).
        check_command(actor=actor, reason=reason, key=key)
        if key is not None:
            previous = self.store.by_command(key)
            if previous:
                return self._repeat(command, change, key, previous, same)
        # Catch up outside the lock (a start-up's replay, a snapshot), then take
        # it, read the few events others appended meanwhile, validate and append
        # in one transaction: a writer waits for its turn and never loses a race.
        self._sync()
        try:
            with self.store.writing() as locked:
                with gc_paused():
                    self._apply(locked.read(after=self._replayer.position))
                events = build()
                if not events:  # nothing to change (an apply of what is there): nothing written
                    return CommandResult((), already_recorded=False, attempts=1)
                outcome = locked.append(
                    events,
                    expected_head=self._replayer.position,
                    actor=actor,
                    reason=reason,
                    key=key,
                )
        except UnvouchedRow as exc:
            raise CommandConflict(str(exc)) from None
        if outcome.already_recorded:
            # Another attempt with our key committed while we waited for the lock.
            return self._repeat(command, change, key or "", outcome.events, same)
        log.info(
            "catalog.appended",
            command=command,
            positions=[e.position for e in outcome.events],
            models=[e.model for e in outcome.events],
            actor=actor,
            attempts=1,
        )
        self._sync()
        return CommandResult(outcome.events, already_recorded=False, attempts=1)

    def _repeat(
        self,
        command: str,
        change: str,
        key: str,
        previous: tuple[StoredEvent, ...],
        same: Same | None = None,
    ) -> CommandResult:
        """The same key again: report the first outcome, if it is the same change.

        Compared by the digest of the whole change (events.idempotency), or for
        an apply by the definition it recorded (``same``): a repeat cannot be
        validated again (the first attempt already changed the catalog), and a
        retry after a timeout, which is what keys are for, sends exactly the
        same change.
        """
        matches = (
            same(previous) if same is not None else recorded_change(command, previous) == change
        )
        if not matches:
            raise KeyReused(
                f"idempotency key {key!r} was already used for a different change "
                f"(position {previous[0].position}, {previous[0].type} of "
                f"{', '.join(e.model or '?' for e in previous)}): the definition sent now is "
                "not the one recorded then. Nothing was written; use a new key for a new change"
            )
        log.info("catalog.command_repeated", command=command, key=key)
        self._sync()
        return CommandResult(previous, already_recorded=True, attempts=0)
