"""The write side: add, remove and apply models, as short handlers over a ``Log``.

Each handler loads the catalog (the read model, events.read.model), checks the
change against it (catalog.whole.state: incrementally, each check in time
proportional to the change, against the rules the whole catalog obeys) and
appends. A model naming a missing fallback, colliding with another, or
malformed is refused rather than persisted and then skipped forever after: a
model that looks added and never appears is the worst outcome available.

What every handler shares is in ``_run``, once: the grammar of who, why and
the key; idempotency (the same key again is recorded once, and the same key
with another change is refused); and the write section. A command validates
and appends holding the log's write lock: it catches up on what other writers
appended, validates against that head and appends in the same transaction, so
concurrent writers queue instead of racing and none has to retry.

Pure of any database: the handlers take a ``Log`` (tests/unit/events run them
against events.storage.memory_log).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import structlog

from catalog import CatalogError, Model, RefusalKind
from catalog.changes.diff import FieldChange, diff_models
from catalog.changes.digest import catalog_digest
from catalog.definition.bind_args import check_no_bind_args
from catalog.definition.engines import check_engines
from catalog.definition.identifiers import check_command
from catalog.reading.declared import require_models
from catalog.secrecy.secrets import check_no_plain_secrets
from events.core.declared_change import DeclaredChange, event_for
from events.core.types import DECLARED_CHANGED, MODEL_ADDED, MODEL_REMOVED, NewEvent, StoredEvent
from events.read.model import CatalogReadModel
from events.storage.log import Log, UnvouchedRow
from events.write.apply import (
    ApplyPlan,
    ApplyResult,
    definition_event,
    outcome_of,
    plan_apply,
    same_definition,
)
from events.write.idempotency import change_digest, recorded_change

Same = Callable[[tuple[StoredEvent, ...]], bool]
# A command's events, each with the definition it encodes (None: not a definition).
Build = Callable[[], list[tuple[NewEvent, Model | None]]]
# The digest of a change (events.write.idempotency), taken only when a key is repeated.
Change = Callable[[], str]

log = structlog.get_logger("llmgw.catalog")


class CommandConflict(Exception):
    """The log could not take a command (its last row is not vouched for by the
    chain); nothing was written."""

    kind: ClassVar[RefusalKind] = "conflict"


class KeyReused(CatalogError):
    """An idempotency key was sent again with a different change."""

    kind: ClassVar[RefusalKind] = "conflict"


@dataclass(frozen=True, slots=True)
class CommandResult:
    events: tuple[StoredEvent, ...]
    already_recorded: bool
    attempts: int

    @property
    def positions(self) -> list[int]:
        return [e.position for e in self.events]


class CatalogCommands:
    """The commands that change the catalog, appending to ``events`` and validating
    against ``model`` (which must read the same log)."""

    def __init__(self, events: Log, model: CatalogReadModel) -> None:
        self.log = events
        self.model = model
        self.declared_digest = catalog_digest(model.declared)

    def add(
        self,
        models: Sequence[Model],
        *,
        actor: str = "",
        reason: str = "",
        key: str | None = None,
    ) -> CommandResult:
        """Add one model or a list, all or nothing."""
        require_models(list(models), "the change")
        for m in models:
            # At the write only: replay reads what older releases stored as it was.
            check_no_plain_secrets(m.profiles, m.name)
            check_no_bind_args(m.profiles, m.name)
            check_engines(m)

        def build() -> list[tuple[NewEvent, Model | None]]:
            ordered = self.model.state.check_add(models)
            return [(definition_event(MODEL_ADDED, m, self.declared_digest), m) for m in ordered]

        def change() -> str:
            return change_digest(MODEL_ADDED, [m.to_definition() for m in models])

        names = [m.name for m in models]
        return self._run(MODEL_ADDED, names, change, build, actor=actor, reason=reason, key=key)

    def remove(
        self, name: str, *, actor: str = "", reason: str = "", key: str | None = None
    ) -> CommandResult:
        def build() -> list[tuple[NewEvent, Model | None]]:
            self.model.state.check_remove(name)
            payload = json.dumps({"name": name})
            return [(NewEvent(type=MODEL_REMOVED, model=name, payload=payload), None)]

        def change() -> str:
            return change_digest(MODEL_REMOVED, [name])

        return self._run(MODEL_REMOVED, [name], change, build, actor=actor, reason=reason, key=key)

    def apply(
        self, model: Model, *, actor: str = "", reason: str = "", key: str | None = None
    ) -> ApplyResult:
        """Add ``model``, or replace the runtime model of its name with it in one event
        (events.write.apply); nothing is written when the catalog already holds it."""
        check_no_plain_secrets(model.profiles, model.name)
        check_no_bind_args(model.profiles, model.name)
        check_engines(model)
        plans: list[ApplyPlan] = []

        def build() -> list[tuple[NewEvent, Model | None]]:
            plans.append(plan_apply(self.model.state, model, self.declared_digest))
            return [(event, plans[-1].model) for event in plans[-1].events]

        def same(previous: tuple[StoredEvent, ...]) -> bool:
            return same_definition(previous, model)

        def change() -> str:
            return change_digest("model.apply", [model.to_definition()])

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

    def declared_changed(self) -> None:
        """The read model took a new declared catalog: later adds are stamped with it."""
        self.declared_digest = catalog_digest(self.model.declared)

    def record_declared(self, change: DeclaredChange, *, actor: str, key: str) -> CommandResult:
        """Record that a running process took a changed declared catalog file.

        ``key`` makes it once per change: the server and a daemon watching the same
        file both notice an edit, and the second finds the first's event.
        """

        def build() -> list[tuple[NewEvent, Model | None]]:
            return [(event_for(change), None)]

        def changed() -> str:
            return change_digest(DECLARED_CHANGED, [change.payload()])

        return self._run(
            DECLARED_CHANGED,
            [],
            changed,
            build,
            actor=actor,
            reason=change.describe()[:2000],
            key=key,
            # The key names the transition (file, old and new digest, the file's
            # modification time): the same key is the same change, noticed twice.
            same=lambda previous: all(e.type == DECLARED_CHANGED for e in previous),
        )

    def _first_apply(self, model: Model, events: tuple[StoredEvent, ...]) -> ApplyResult:
        """A repeated key's first outcome, its changes read from the log as they were."""
        (event,) = events
        outcome = outcome_of(event)
        changes: tuple[FieldChange, ...] = ()
        if outcome == "replaced":
            _, before = self.model.catalog_at(event.position - 1)
            old = before.resolve(model.name)
            changes = diff_models(old, model) if old is not None else ()
        return ApplyResult(outcome, model.name, changes, events, True)

    def _run(
        self,
        command: str,
        names: list[str],
        change: Change,
        build: Build,
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
            previous = self.log.by_command(key)
            if previous:
                return self._repeat(command, change, key, previous, same)
        model = self.model
        with model.lock:
            # A start-up's replay (or restore) outside the write lock; then, every
            # time, take the lock, read the few events others appended since, validate
            # and append in one transaction: a writer waits for its turn, never loses
            # a race, and catches up once.
            model.start()
            try:
                with self.log.writing() as locked:
                    model.catch_up_locked(locked)
                    built = build()
                    events = [event for event, _ in built]
                    if not events:  # nothing to change (an apply of what is there)
                        return CommandResult((), already_recorded=False, attempts=1)
                    outcome = locked.append(
                        events,
                        expected_head=model.position,
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
            model.wrote(outcome.events, [decoded for _, decoded in built])
        return CommandResult(outcome.events, already_recorded=False, attempts=1)

    def _repeat(
        self,
        command: str,
        change: Change,
        key: str,
        previous: tuple[StoredEvent, ...],
        same: Same | None = None,
    ) -> CommandResult:
        """The same key again: report the first outcome, if it is the same change.

        Compared by the digest of the whole change (events.write.idempotency), or for
        an apply by the definition it recorded (``same``): a repeat cannot be
        validated again (the first attempt already changed the catalog), and a
        retry after a timeout, which is what keys are for, sends exactly the
        same change.
        """
        matches = (
            same(previous) if same is not None else recorded_change(command, previous) == change()
        )
        if not matches:
            raise KeyReused(
                f"idempotency key {key!r} was already used for a different change "
                f"(position {previous[0].position}, {previous[0].type} of "
                f"{', '.join(e.model or '?' for e in previous)}): the definition sent now is "
                "not the one recorded then. Nothing was written; use a new key for a new change"
            )
        log.info("catalog.command_repeated", command=command, key=key)
        with self.model.lock:
            self.model.wrote()
        return CommandResult(previous, already_recorded=True, attempts=0)
