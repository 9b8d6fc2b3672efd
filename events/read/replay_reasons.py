"""Replay, explained: each event applied or skipped, and for a skipped one, why in context.

The reason replay gives for a skip names the rule; on call, the next question
is what the catalog looked like at that moment: which model already held the
name or alias the event wanted, which fallbacks were missing and what was
there instead, which models still fell back to the one being removed. That
context is computed here from the replay state just before the event (a
skipped event changes nothing, so it is the state just after it, too).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from catalog import Catalog, CatalogState, Model
from catalog.changes.digest import catalog_digest
from catalog.forms.text import shown
from catalog.reading.documents import read_json
from events.core.chain import canonical_time
from events.core.types import DEFINITION_TYPES, MODEL_REMOVED, MODEL_REPLACED, StoredEvent
from events.read.replay import STORED_LIMITS, Replayer

# How many names a context lists before it only counts the rest.
SHOWN = 20


@dataclass(frozen=True, slots=True)
class Step:
    position: int
    event_id: str
    type: str
    model: str | None
    actor: str
    recorded_at: datetime
    applied: bool
    reason: str | None = None
    context: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "position": self.position,
            "event_id": self.event_id,
            "type": self.type,
            "model": self.model,
            "actor": self.actor,
            "recorded_at": canonical_time(self.recorded_at),
            "outcome": "applied" if self.applied else "skipped",
        }
        if not self.applied:
            out["reason"] = self.reason
            out["context"] = self.context
        return out


def explain(
    declared: Catalog, events: Iterable[StoredEvent], config_path: str = "catalog.yaml"
) -> tuple[Replayer, Iterator[Step]]:
    """A replayer and the steps of replaying ``events`` into it, lazily, one per event."""
    replayer = Replayer.start(declared, config_path)
    digest = catalog_digest(declared)

    def steps() -> Iterator[Step]:
        for event in events:
            skipped = replayer.apply(event)
            base = (
                event.position,
                event.event_id,
                event.type,
                event.model,
                event.actor,
                event.recorded_at,
            )
            if skipped is None:
                yield Step(*base, applied=True)
            else:
                context = _context(replayer.state, event, digest)
                yield Step(*base, applied=False, reason=skipped.reason, context=context)

    return replayer, steps()


def _context(state: CatalogState, event: StoredEvent, digest: str) -> dict[str, Any]:
    try:
        payload = read_json(event.payload, "payload", STORED_LIMITS)
    except Exception:  # any row that cannot be read is shown as an excerpt
        payload = None
    if not isinstance(payload, dict) or event.type not in (*DEFINITION_TYPES, MODEL_REMOVED):
        return {"payload": _excerpt(event.payload)}
    if event.type == MODEL_REMOVED:
        return _removal_context(state, payload.get("name"))
    if event.type == MODEL_REPLACED:
        return _replacement_context(state, payload, digest)
    return _addition_context(state, payload, digest)


def _replacement_context(
    state: CatalogState, payload: dict[str, Any], digest: str
) -> dict[str, Any]:
    """A replacement is judged as an addition against the catalog without the model it
    replaces: absent or declared, or the same collisions and missing fallbacks, less
    what the model itself holds; plus who still falls back to an alias it drops."""
    raw = payload.get("model")
    name = raw.get("name") if isinstance(raw, dict) else None
    current = state.resolve(name) if isinstance(name, str) else None
    if not isinstance(name, str) or current is None or current.name != name:
        return _addition_context(state, payload, digest) if name is None else _present(state, name)
    if state.is_declared(name):
        return {"declared_in": state.config_path}
    out = _addition_context(state, payload, digest, replacing=current)
    aliases = raw.get("aliases") if isinstance(raw, dict) else None
    kept = set(aliases) if isinstance(aliases, list) else set()
    dropped = {a for a in current.aliases if a not in kept}
    stranded = state.alias_dependents(name, dropped)
    if stranded:
        out["dropped_aliases"] = sorted(dropped)
        out["alias_dependents"] = stranded
    return out


def _addition_context(
    state: CatalogState, payload: dict[str, Any], digest: str, *, replacing: Model | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    recorded = payload.get("declared_digest")
    if isinstance(recorded, str):
        # Schema v2 records the declared catalog the add was validated against.
        out["declared_changed_since"] = recorded != digest
    raw = payload.get("model")
    if not isinstance(raw, dict):
        return {**out, "payload": _excerpt(json.dumps(payload))}
    names = [raw.get("name")]
    aliases = raw.get("aliases")
    if isinstance(aliases, list):
        names += aliases
    own = [n for n in names if isinstance(n, str)]
    collisions = []
    for name in own:
        found = state.holder(name)  # regardless of case, as the rule is
        if found is not None and (replacing is None or found[1].name != replacing.name):
            written, holder = found
            collisions.append(
                {
                    "name": written,
                    "held_by": holder.name,
                    "as": "name" if holder.name == written else "alias",
                    "declared": state.is_declared(holder.name),
                }
            )
    if collisions:
        out["collides_with"] = collisions
    fallbacks = raw.get("fallbacks")
    if isinstance(fallbacks, list):
        gone = set() if replacing is None else set(replacing.aliases) - set(own)
        missing = [
            f
            for f in fallbacks
            if isinstance(f, str) and (f not in state or f in gone) and f not in own
        ]
        if missing:
            out["missing_fallbacks"] = missing
            out.update(_present(state, missing[0]))
    return out


def _removal_context(state: CatalogState, name: object) -> dict[str, Any]:
    if not isinstance(name, str):
        return {}
    model = state.resolve(name)
    if model is None:
        return _present(state, name)
    if state.is_declared(model.name):
        return {"declared_in": state.config_path}
    catalog = state.snapshot()
    dependents = sorted(
        m.name
        for m in catalog.models()
        if m.name != model.name and model.name in catalog.fallbacks_of(m.name)
    )
    return {"dependents": dependents} if dependents else {}


def _present(state: CatalogState, wanted: str) -> dict[str, Any]:
    """What the catalog held instead of ``wanted``: the closest names, and a sample."""
    catalog = state.snapshot()
    names = [m.name for m in catalog.models()]
    every = names + [a for m in catalog.models() for a in m.aliases]
    return {
        "similar": difflib.get_close_matches(wanted, every, n=3),
        "models_present": names[:SHOWN],
        "models_present_count": len(names),
    }


def _excerpt(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_context(context: dict[str, Any]) -> list[str]:
    """The context of a skipped event as lines for people."""
    # Names come from stored rows, which may predate the identifier grammar: `shown`.
    lines = []
    for c in context.get("collides_with", ()):
        origin = "declared" if c["declared"] else "runtime"
        if c["as"] == "name":
            lines.append(f"collides with: {shown(c['name'])}, a {origin} model")
        else:
            lines.append(
                f"collides with: {shown(c['name'])}, an alias of {origin} model "
                f"{shown(c['held_by'])}"
            )
    if "missing_fallbacks" in context:
        lines.append(f"missing fallbacks: {', '.join(map(shown, context['missing_fallbacks']))}")
    if "declared_in" in context:
        lines.append(f"declared in {shown(context['declared_in'])}")
    if context.get("dependents"):
        lines.append(f"still falling back to it: {', '.join(map(shown, context['dependents']))}")
    if context.get("alias_dependents"):
        lines.append(
            "still falling back to dropped alias "
            f"{', '.join(map(shown, context['dropped_aliases']))}: "
            f"{', '.join(map(shown, context['alias_dependents']))}"
        )
    if "models_present_count" in context:
        present = context["models_present"]
        more = context["models_present_count"] - len(present)
        listed = ", ".join(map(shown, present)) + (f", ... ({more} more)" if more > 0 else "")
        lines.append(f"models present ({context['models_present_count']}): {listed or 'none'}")
        if context.get("similar"):
            lines.append(f"similar names: {', '.join(map(shown, context['similar']))}")
    if context.get("declared_changed_since"):
        lines.append("the declared configuration changed since this event was written")
    elif context.get("declared_changed_since") is False:
        lines.append("written against this same declared configuration")
    if "payload" in context:
        lines.append(f"payload: {shown(context['payload'])}")
    return lines
