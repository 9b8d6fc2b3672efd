"""What a command changes, as one digest: how a repeated idempotency key is judged.

A key is for retrying one change (after a timeout, a lost answer). The same key
with another change must be refused, or the client believes its new
definition is live while the first one is. A model's name is not the change:
the whole normalised definition is, so two adds of ``llama`` with different
``source`` differ. The digest is taken over the definitions as normalised by
the domain, so the same definition written with other defaults, key order or
spelling of a duration is the same change.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence

from catalog import CatalogError, parse_model
from events.core.types import MODEL_ADDED, MODEL_REMOVED, StoredEvent
from events.core.upcast import UnreadableEvent, upcast


def change_digest(command: str, changes: Iterable[object]) -> str:
    """sha256 of the command and its changes (a definition per model added, a name
    per model removed), in any order: a list add is one change, whatever its order."""
    items = sorted(json.dumps(c, sort_keys=True, separators=(",", ":")) for c in changes)
    text = json.dumps([command, items], separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def recorded_change(command: str, events: Sequence[StoredEvent]) -> str | None:
    """The digest of the change the stored events recorded; None if they are not a
    ``command`` this code can read back (then no repeat can be the same change)."""
    changes: list[object] = []
    for event in events:
        if event.type != command:
            return None
        try:
            payload = upcast(event.type, event.schema_version, json.loads(event.payload))
            if command == MODEL_ADDED:
                changes.append(parse_model(payload.get("model")).to_definition())
            elif command == MODEL_REMOVED:
                changes.append(payload["name"])
            else:
                return None
        except (
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
            RecursionError,  # (a payload nested past the parser)
            CatalogError,
            UnreadableEvent,
        ):
            return None
    return change_digest(command, changes)
