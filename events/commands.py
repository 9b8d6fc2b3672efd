"""The write side: add and remove models, each checked against the whole resulting catalog.

The whole catalog is built before anything is written: a model naming a
missing fallback, colliding with another, or malformed is refused rather than
persisted and then skipped forever after. A model that looks added and never
appears is the worst outcome available.

Validation runs against the catalog at some log position N, and the append
succeeds only if the log is still at N. If another writer got there first, the
command catches up on the new events, validates again and retries, a bounded
number of times; a retried command with the same key is recorded once.
"""

from __future__ import annotations

import gc
import json
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import structlog
from sqlalchemy.exc import SQLAlchemyError

from catalog import Catalog, CatalogError, Model
from catalog.diff import FieldChange, diff_models
from catalog.digest import catalog_digest
from events.apply import (
    ApplyPlan,
    ApplyResult,
    definition_event,
    outcome_of,
    plan_apply,
    same_definition,
)
from events.replay import Replayer, ReplayResult
from events.snapshots import SnapshotStore
from events.store import ConcurrencyConflict, EventStore
from events.timetravel import catalog_at
from events.types import MODEL_ADDED, MODEL_REMOVED, NewEvent, StoredEvent

Same = Callable[[tuple[StoredEvent, ...]], bool]

log = structlog.get_logger("llmgw.catalog")

MAX_ATTEMPTS = 8
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
    """The log kept moving under a command; nothing was written."""


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
    one (``snapshot_every=None``: never). A ``ReplayResult`` from a service
    restored from a snapshot lists only the events after it.
    """

    def __init__(
        self,
        store: EventStore,
        declared: Catalog,
        config_path: str = "catalog.yaml",
        *,
        snapshot_every: int | None = SNAPSHOT_EVERY,
    ):
        self.store = store
        self.declared = declared
        self.config_path = config_path
        self.declared_digest = catalog_digest(declared)
        self.snapshots = SnapshotStore(store.engine)
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
        for event in self.store.read(after=self._replayer.position):
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
        return self._run(MODEL_ADDED, names, build, actor=actor, reason=reason, key=key)

    def remove(
        self, name: str, *, actor: str = "", reason: str = "", key: str | None = None
    ) -> CommandResult:
        def build() -> list[NewEvent]:
            self._replayer.state.check_remove(name)
            return [NewEvent(type=MODEL_REMOVED, model=name, payload=json.dumps({"name": name}))]

        return self._run(MODEL_REMOVED, [name], build, actor=actor, reason=reason, key=key)

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

        result = self._run(
            "model.apply", [model.name], build, actor=actor, reason=reason, key=key, same=same
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
        build: Callable[[], list[NewEvent]],
        *,
        actor: str,
        reason: str,
        key: str | None,
        same: Same | None = None,
    ) -> CommandResult:
        if key is not None:
            previous = self.store.by_command(key)
            if previous:
                return self._repeat(command, names, key, previous, same)
        for attempt in range(1, MAX_ATTEMPTS + 1):
            self._sync()
            events = build()
            if not events:  # nothing to change (an apply of what is there): nothing written
                return CommandResult((), already_recorded=False, attempts=attempt)
            try:
                outcome = self.store.append(
                    events,
                    expected_head=self._replayer.position,
                    actor=actor,
                    reason=reason,
                    key=key,
                )
            except ConcurrencyConflict as conflict:
                log.info(
                    "catalog.append_conflict",
                    command=command,
                    attempt=attempt,
                    expected=conflict.expected,
                    actual=conflict.actual,
                )
                # Writers that lost a race retry at once and collide again; a
                # random pause, growing with each loss, spreads them out.
                time.sleep(random.uniform(0, min(0.1, 0.002 * 2**attempt)))
                continue
            if outcome.already_recorded:
                # A retry of ours raced with the first attempt and lost: report its outcome.
                return self._repeat(command, names, key or "", outcome.events, same)
            log.info(
                "catalog.appended",
                command=command,
                positions=[e.position for e in outcome.events],
                models=[e.model for e in outcome.events],
                actor=actor,
                attempts=attempt,
            )
            self._sync()
            return CommandResult(outcome.events, already_recorded=False, attempts=attempt)
        raise CommandConflict(
            f"{command} of {', '.join(names)} gave up after {MAX_ATTEMPTS} attempts: other "
            "writers kept appending to the log while it validated. Nothing was written; "
            "run it again."
        )

    def _repeat(
        self,
        command: str,
        names: list[str],
        key: str,
        previous: tuple[StoredEvent, ...],
        same: Same | None = None,
    ) -> CommandResult:
        """The same key again: report the first outcome, if it is the same change.

        Compared by type and model names (an apply compares the definition, by
        ``same``): a repeat cannot be validated again (the first attempt
        already changed the catalog), and a retry after a timeout, which is
        what keys are for, names the same models.
        """
        if same is not None:
            matches = same(previous)
        else:
            matches = all(e.type == command for e in previous) and sorted(names) == sorted(
                e.model or "" for e in previous
            )
        if not matches:
            raise KeyReused(
                f"idempotency key {key!r} was already used for a different change "
                f"(position {previous[0].position}); use a new key for a new change"
            )
        log.info("catalog.command_repeated", command=command, key=key)
        self._sync()
        return CommandResult(previous, already_recorded=True, attempts=0)
