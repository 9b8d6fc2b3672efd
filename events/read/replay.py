"""Replay: the declared models, then each stored event judged on its own.

Pure: events in, catalog out. At start-up and on every read each stored event
is validated against what is already accepted, so one bad row (unreadable, of
an unknown type, invalid, or colliding with a model declared since it was
written) is skipped and named rather than taking the catalog down with it.
The declared models are applied first and are precisely the ones that must
survive. The same declared configuration and the same events always give the
same catalog, which is what makes debugging by replay possible.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from catalog import Catalog, CatalogError, CatalogState, Model, parse_model
from catalog.reading.documents import Limits, read_json
from catalog.stored.fast_decode import decode_definition, decode_removal, fast_path_applies
from events.core.declared_change import check_declared_change
from events.core.rows import ReplayEvent
from events.core.token_change import check_token_change
from events.core.types import (
    CURRENT_SCHEMA,
    DECLARED_CHANGED,
    DEFINITION_TYPES,
    MODEL_ADDED,
    MODEL_REMOVED,
    MODEL_REPLACED,
    TOKEN_TYPES,
    USAGE_RECORDED,
    StoredEvent,
)
from events.core.upcast import UnreadableEvent, upcast
from events.core.usage import check_usage

# A stored payload is one definition: what a request body may hold, at most.
STORED_LIMITS = Limits(max_bytes=16 << 20, max_nodes=100_000)
# catalog.stored.fast_decode answers only for payloads these limits could not refuse.
assert fast_path_applies(STORED_LIMITS)
_ADDED_VERSION = CURRENT_SCHEMA[MODEL_ADDED]
_REMOVED_VERSION = CURRENT_SCHEMA[MODEL_REMOVED]


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class SkippedEvent:
    position: int
    event_id: str
    type: str
    reason: str

    def to_json(self) -> dict[str, object]:
        return {
            "position": self.position,
            "event_id": self.event_id,
            "type": self.type,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class ReplayResult:
    catalog: Catalog
    position: int
    applied: tuple[int, ...]
    skipped: tuple[SkippedEvent, ...]


@dataclass
class Replayer:
    """Replay state that can be advanced event by event (for tailing the log).

    A replayer resumed from a snapshot (``resume``) lists in ``applied`` and
    ``skipped`` only the events after the snapshot; the counts before it are
    ``applied_before`` and ``skipped_before``.
    """

    state: CatalogState
    position: int = 0
    applied: list[int] = field(default_factory=list)
    skipped: list[SkippedEvent] = field(default_factory=list)
    applied_before: int = 0
    skipped_before: int = 0

    @classmethod
    def start(cls, declared: Catalog, config_path: str = "catalog.yaml") -> Replayer:
        return cls(CatalogState(declared, config_path=config_path))

    @classmethod
    def resume(
        cls, state: CatalogState, position: int, *, applied: int = 0, skipped: int = 0
    ) -> Replayer:
        """Continue from saved state: ``state`` as of ``position``, with the counts so far."""
        return cls(state, position, applied_before=applied, skipped_before=skipped)

    @property
    def applied_count(self) -> int:
        return self.applied_before + len(self.applied)

    @property
    def skipped_count(self) -> int:
        return self.skipped_before + len(self.skipped)

    def apply(
        self, event: StoredEvent | ReplayEvent, decoded: Model | None = None
    ) -> SkippedEvent | None:
        """Apply one event if it is valid against what is accepted; else record why not.

        ``decoded``: the definition the event's payload holds, when the caller has
        it already (a command applying what it has just appended, from the model
        it encoded: ``parse_model`` gives that model back from the stored text,
        tests/unit/catalog/test_catalog_properties.py); it is judged exactly as
        a decoded payload is.
        """
        position = event.position
        if position <= self.position:
            raise ValueError(
                f"event at position {position} replayed after position {self.position}"
            )
        if decoded is None and event.unreadable is None:
            # The common cases first, in as few steps as they can be taken: an add or a
            # removal as this release writes it, decoded by catalog.stored.fast_decode and
            # accepted by look-ups. Whatever either declines (a payload it is not sure
            # of, a change the catalog refuses) goes the whole way below, which decides
            # and names the reason exactly as it always has.
            type_ = event.type
            if type_ == MODEL_ADDED:
                if event.schema_version == _ADDED_VERSION:
                    model = decode_definition(event.payload)
                    if model is not None and self.state.add_if_fits(model):
                        self.position = position
                        self.applied.append(position)
                        return None
            elif type_ == MODEL_REMOVED and event.schema_version == _REMOVED_VERSION:
                name = decode_removal(event.payload)
                if name is not None and self.state.remove_if_allowed(name):
                    self.position = position
                    self.applied.append(position)
                    return None
        self.position = position
        try:
            if (
                decoded is not None
                and event.unreadable is None
                and event.type in DEFINITION_TYPES
                and event.schema_version == CURRENT_SCHEMA[event.type]
            ):
                self._apply_definition(event.type, decoded)
            else:
                self._apply(event)
        except (CatalogError, UnreadableEvent) as exc:
            skipped = SkippedEvent(event.position, event.event_id, event.type, str(exc))
            self.skipped.append(skipped)
            return skipped
        except Exception as exc:
            # Any other failure to decode or validate a stored row (a RecursionError,
            # a column of the wrong type, a bug in an upcaster) is still one bad row:
            # skipped and named, never the end of the catalog. Nothing was changed:
            # the state is only written after every check has passed.
            reason = f"cannot be read ({type(exc).__name__}: {_short(str(exc))})"
            skipped = SkippedEvent(event.position, event.event_id, event.type, reason)
            self.skipped.append(skipped)
            return skipped
        self.applied.append(event.position)
        return None

    def apply_accepted(self, event: StoredEvent, model: Model) -> None:
        """Apply a definition event its command has just judged and appended.

        The command judged ``model`` against this very state (``check_add`` or
        ``check_replace``, holding the read model's lock, with nothing applied
        since; a batch in the order ``check_add`` gave, in which each addition
        passes on its own) and those checks are the ones ``apply`` would run:
        judging it again gives the same verdict and cost about 6 us of an add
        (BENCHMARKS.md, "Validated adds", third round).
        tests/unit/events/test_commands.py holds the writer's catalog equal to a
        fresh replay of its log.
        """
        if event.position <= self.position:
            raise ValueError(
                f"event at position {event.position} replayed after position {self.position}"
            )
        self.position = event.position
        if event.type == MODEL_REPLACED:
            self.state.replace(model)
        else:
            self.state.add(model)
        self.applied.append(event.position)

    def apply_all(self, events: Iterable[StoredEvent | ReplayEvent]) -> None:
        for event in events:
            self.apply(event)

    def _apply(self, event: StoredEvent | ReplayEvent) -> None:
        if event.unreadable is not None:
            raise UnreadableEvent(event.unreadable)
        if event.type in DEFINITION_TYPES and event.schema_version == CURRENT_SCHEMA[event.type]:
            # The common case, an add or a replacement as this release writes
            # it (nothing to upcast): decoded by catalog.stored.fast_decode, which
            # answers only when it is sure the general path below would give
            # the same model. Anything else takes the general path, which
            # accepts or names the problem exactly as it always has. (The
            # pydantic fast path that stood here accepted two kinds of hostile
            # payload the general path refuses, more than 100,000 JSON values
            # and an unread key nested deeper than 32; they are now refused,
            # as the general path and every write refuse them.)
            model = decode_definition(event.payload)
            if model is not None:
                self._apply_definition(event.type, model)
                return
        elif event.type == MODEL_REMOVED and event.schema_version == CURRENT_SCHEMA[MODEL_REMOVED]:
            # A removal as this release writes it: the name, when catalog.stored.fast_decode
            # is sure of it; anything else is read the general way below.
            name = decode_removal(event.payload)
            if name is not None:
                self.state.check_remove(name)
                self.state.remove(name)
                return
        try:
            payload = read_json(event.payload, "payload", STORED_LIMITS)
        except CatalogError as exc:
            raise UnreadableEvent(str(exc)) from None
        if not isinstance(payload, dict):
            raise UnreadableEvent("payload is not a JSON object")
        payload = upcast(event.type, event.schema_version, payload)
        if event.type in DEFINITION_TYPES:
            self._apply_definition(event.type, parse_model(payload.get("model")))
        elif event.type == DECLARED_CHANGED:
            check_declared_change(payload)
        elif event.type in TOKEN_TYPES:
            # The token table holds the tokens; the catalog has nothing to apply.
            check_token_change(event.type, payload)
        elif event.type == USAGE_RECORDED:
            # A gateway's usage counts: the ledger sums them (events.read.ledger); the
            # catalog has nothing to apply.
            check_usage(payload)
        elif event.type == MODEL_REMOVED:
            name = payload.get("name")
            if not isinstance(name, str):
                raise UnreadableEvent("payload has no model name to remove")
            self.state.check_remove(name)
            self.state.remove(name)

    def _apply_definition(self, event_type: str, model: Model) -> None:
        if event_type == MODEL_REPLACED:
            self.state.check_replace(model)
            self.state.replace(model)
        else:
            self.state.check_add([model])
            self.state.add(model)

    def result(self) -> ReplayResult:
        return ReplayResult(
            catalog=self.state.snapshot(),
            position=self.position,
            applied=tuple(self.applied),
            skipped=tuple(self.skipped),
        )


def replay(
    declared: Catalog,
    events: Iterable[StoredEvent | ReplayEvent],
    config_path: str = "catalog.yaml",
) -> ReplayResult:
    replayer = Replayer.start(declared, config_path)
    replayer.apply_all(events)
    return replayer.result()
