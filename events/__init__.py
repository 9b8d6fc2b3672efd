"""The catalog's event log: storage, replay into a catalog, and the commands that append."""

from events.commands import CatalogService, CommandConflict, CommandResult, KeyReused
from events.replay import Replayer, ReplayResult, SkippedEvent, replay
from events.store import AppendOutcome, ConcurrencyConflict, EventStore
from events.types import MODEL_ADDED, MODEL_REMOVED, MODEL_REPLACED, NewEvent, StoredEvent

__all__ = [
    "MODEL_ADDED",
    "MODEL_REMOVED",
    "MODEL_REPLACED",
    "AppendOutcome",
    "CatalogService",
    "CommandConflict",
    "CommandResult",
    "ConcurrencyConflict",
    "EventStore",
    "KeyReused",
    "NewEvent",
    "ReplayResult",
    "Replayer",
    "SkippedEvent",
    "StoredEvent",
    "replay",
]
