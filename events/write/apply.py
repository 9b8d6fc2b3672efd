"""Apply: make a runtime model's definition exactly the one given, in one event.

Replacing a model used to be a removal and then an addition: two events, with
a moment between them when the model was gone from the catalog and the
scheduler stopped its replicas. ``apply`` adds the model when it is absent and
otherwise records one ``model.replaced`` event holding the whole new
definition, judged against the whole catalog exactly as an addition is, so
the model is never missing and nothing invalid is written. Applying the
definition the catalog already holds writes nothing.

Pure: the catalog state and a definition in, what to append (and what it
changes, in ``llmgw diff``'s words) out. The apply handler (events.write.commands) runs it
under the same optimistic concurrency and idempotency as add and remove.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from catalog import CatalogError, CatalogState, Model
from catalog.changes.diff import CatalogDiff, FieldChange, ModelChange, diff_models
from events.core.types import (
    CURRENT_SCHEMA,
    DEFINITION_TYPES,
    MODEL_ADDED,
    MODEL_REPLACED,
    NewEvent,
    StoredEvent,
)

Outcome = Literal["added", "replaced", "unchanged"]


# A definition event's payload is ``{"model": definition, "declared_digest": ...}``
# in compact JSON, the definition written by pydantic's own serializer (the JSON
# of what ``to_definition()`` holds, in the model's field order). Encoding it
# with ``json.dumps(..., sort_keys=True)`` of ``to_definition()`` was a fifth of a
# validated add's CPU; this is a quarter of that (BENCHMARKS.md, "Validated
# adds"). Readers parse the text, never compare it: replay, idempotency and
# ``same_definition`` decode it, and the hash chain covers whatever was stored.
# Rows written before keep their spaced, sorted form; both read the same
# (tests/unit/events/test_stored_payload.py).
_ENCODE = msgspec.json.Encoder().encode


def definition_payload(model: Model, declared_digest: str | None) -> str:
    """The stored text of a definition event for ``model``."""
    body = type(model).__pydantic_serializer__.to_json(model)
    return (b'{"model":' + body + b',"declared_digest":' + _ENCODE(declared_digest) + b"}").decode()


def definition_event(event_type: str, model: Model, declared_digest: str) -> NewEvent:
    """A ``model.added`` or ``model.replaced`` event: the whole definition, defaults applied,
    and the declared catalog it was judged against."""
    return NewEvent(
        type=event_type,
        model=model.name,
        payload=definition_payload(model, declared_digest),
        schema_version=CURRENT_SCHEMA[event_type],
    )


@dataclass(frozen=True, slots=True)
class ApplyPlan:
    """What applying a definition to the catalog as it is would do."""

    outcome: Outcome
    model: Model
    changes: tuple[FieldChange, ...]  # the replaced fields; empty for an addition
    events: tuple[NewEvent, ...]  # nothing when unchanged


def plan_apply(state: CatalogState, model: Model, declared_digest: str) -> ApplyPlan:
    """Judge ``model`` against ``state``: an addition when no model has its name (an alias
    of another model is a collision, refused as an addition refuses it), else a
    replacement; a declared model is refused, naming the file to edit, even when
    the definition is the same."""
    current = state.resolve(model.name)
    if current is None or current.name != model.name:
        state.check_add([model])
        event = definition_event(MODEL_ADDED, model, declared_digest)
        return ApplyPlan("added", model, (), (event,))
    old = state.check_replace(model)
    changes = diff_models(old, model)
    if not changes:
        return ApplyPlan("unchanged", model, (), ())
    event = definition_event(MODEL_REPLACED, model, declared_digest)
    return ApplyPlan("replaced", model, changes, (event,))


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What an apply did (or, for a repeated key, what the first attempt did)."""

    outcome: Outcome
    model: str
    changes: tuple[FieldChange, ...]
    events: tuple[StoredEvent, ...]
    already_recorded: bool

    @property
    def position(self) -> int | None:
        return self.events[-1].position if self.events else None

    def diff(self) -> CatalogDiff:
        """The change in ``llmgw diff``'s shape: the model added, or its fields changed."""
        if self.outcome == "added":
            return CatalogDiff(added=(self.model,), removed=(), changed=())
        changed = (ModelChange(self.model, self.changes),) if self.changes else ()
        return CatalogDiff(added=(), removed=(), changed=changed)

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "model": self.model,
            "position": self.position,
            "already_recorded": self.already_recorded,
            "diff": self.diff().to_json(),
        }

    def render(self) -> str:
        """The lines ``llmgw apply`` prints."""
        if self.outcome == "unchanged":
            return (
                f"unchanged {self.model}: the catalog already holds this definition; "
                "nothing written\n"
            )
        head = "already recorded: " if self.already_recorded else ""
        return f"{head}{self.outcome} {self.model} at position {self.position}\n" + (
            self.diff().render()
        )


def same_definition(previous: tuple[StoredEvent, ...], model: Model) -> bool:
    """Whether the events a key recorded are this very apply: one addition or
    replacement of this model with this definition. Compared by definition, not
    only by name, since a replacement is all about the definition."""
    if len(previous) != 1 or previous[0].type not in DEFINITION_TYPES:
        return False
    event = previous[0]
    if event.model != model.name:
        return False
    try:
        stored = json.loads(event.payload).get("model")
    except (ValueError, AttributeError, RecursionError):  # (nested past the parser)
        return False
    return bool(stored == json.loads(json.dumps(model.to_definition())))


def outcome_of(event: StoredEvent) -> Outcome:
    if event.type == MODEL_REPLACED:
        return "replaced"
    if event.type == MODEL_ADDED:
        return "added"
    raise CatalogError(f"event at position {event.position} is not an apply ({event.type})")
