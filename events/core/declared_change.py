"""A change of the declared catalog file, as the event ``catalog.declared_changed`` holds it.

Pure. ``declared_change`` compares two declared catalogs model by model (by name:
a model renamed in the file is one removed and one added); ``event_for`` is the
event a running process appends when it takes a new file; ``check_declared_change``
is replay's reading of such an event (any other shape is skipped and named).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from catalog import Catalog
from catalog.changes.digest import catalog_digest
from events.core.types import CURRENT_SCHEMA, DECLARED_CHANGED, NewEvent
from events.core.upcast import UnreadableEvent

# Bounds on what replay reads of such an event (the store bounds the payload too).
MAX_NAMES = 100_000


@dataclass(frozen=True, slots=True)
class DeclaredChange:
    path: str
    old_digest: str
    new_digest: str
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    @property
    def models_changed(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def describe(self) -> str:
        """One line for people: which models changed, and the digests."""
        parts = [
            f"{what} {', '.join(names)}"
            for what, names in (
                ("added", self.added),
                ("removed", self.removed),
                ("changed", self.changed),
            )
            if names
        ]
        what = "; ".join(parts) if parts else "no model changed (order or origin only)"
        return (
            f"declared catalog {self.path} reloaded: {what} "
            f"(digest {self.old_digest[:12]} -> {self.new_digest[:12]})"
        )

    def payload(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "old_digest": self.old_digest,
            "new_digest": self.new_digest,
            "added": list(self.added),
            "removed": list(self.removed),
            "changed": list(self.changed),
        }


def declared_change(old: Catalog, new: Catalog, path: str) -> DeclaredChange:
    """What changed between two declared catalogs, by model name, in the new file's order."""
    before = {m.name: m for m in old.models() if old.is_declared(m.name)}
    after = {m.name: m for m in new.models() if new.is_declared(m.name)}
    return DeclaredChange(
        path=path,
        old_digest=catalog_digest(old),
        new_digest=catalog_digest(new),
        added=tuple(n for n in after if n not in before),
        removed=tuple(n for n in before if n not in after),
        changed=tuple(
            n
            for n in after
            if n in before and before[n].to_definition() != after[n].to_definition()
        ),
    )


def event_for(change: DeclaredChange) -> NewEvent:
    # ``model``: the one model that changed, so `history --model NAME` finds it;
    # "" when several did (the payload names them all).
    names = (*change.added, *change.removed, *change.changed)
    return NewEvent(
        type=DECLARED_CHANGED,
        model=names[0] if len(names) == 1 else "",
        payload=json.dumps(change.payload(), separators=(",", ":")),
        schema_version=CURRENT_SCHEMA[DECLARED_CHANGED],
    )


def check_declared_change(payload: dict[str, Any]) -> DeclaredChange:
    """Replay's reading of the event's (upcast) payload; anything else is unreadable."""
    texts = {k: payload.get(k) for k in ("path", "old_digest", "new_digest")}
    for key, value in texts.items():
        if not isinstance(value, str):
            raise UnreadableEvent(f"payload {key} is not text")
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("added", "removed", "changed"):
        value = payload.get(key, [])
        if (
            not isinstance(value, list)
            or len(value) > MAX_NAMES
            or not all(isinstance(v, str) for v in value)
        ):
            raise UnreadableEvent(f"payload {key} is not a list of model names")
        lists[key] = tuple(value)
    return DeclaredChange(
        path=str(texts["path"]),
        old_digest=str(texts["old_digest"]),
        new_digest=str(texts["new_digest"]),
        **lists,
    )
