"""What changed between two catalogs: models added, removed, and changed field by field.

Pure: two ``Catalog`` values in, a ``CatalogDiff`` out. Fields are compared as
the definitions operators write (``to_definition``), and named by dotted paths
in the same words: ``scaling.min``, ``slo.ttft_p99``, ``profiles[t4].tp``,
``profiles[t4].env.HF_TOKEN``. Profiles are matched by name, not by index, so
inserting a profile reads as one profile added rather than every later one
changed; a change in their order is reported on its own (``profiles (order)``),
since the order is part of the definition.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from catalog.definition.model import Model
from catalog.forms.text import shown
from catalog.whole.catalog import Catalog


class _Absent:
    """A field or entry that one side does not have (a profile added, an env key removed)."""

    def __repr__(self) -> str:
        return "(absent)"


ABSENT: Any = _Absent()


@dataclass(frozen=True, slots=True)
class FieldChange:
    path: str
    before: Any  # JSON-ready value, or ABSENT
    after: Any

    def render(self) -> str:
        # A whole profile appearing or going is one line; --json carries its fields.
        if self.before is ABSENT and isinstance(self.after, dict):
            return f"{self.path}: added"
        if self.after is ABSENT and isinstance(self.before, dict):
            return f"{self.path}: removed"
        return f"{self.path}: {_show(self.before)} -> {_show(self.after)}"

    def to_json(self) -> dict[str, Any]:
        # Absent is null: no field of a definition is ever null itself.
        return {
            "path": self.path,
            "before": None if self.before is ABSENT else self.before,
            "after": None if self.after is ABSENT else self.after,
        }


@dataclass(frozen=True, slots=True)
class ModelChange:
    name: str
    changes: tuple[FieldChange, ...]

    def to_json(self) -> dict[str, Any]:
        return {"model": self.name, "changes": [c.to_json() for c in self.changes]}


@dataclass(frozen=True, slots=True)
class CatalogDiff:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[ModelChange, ...]

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def to_json(self) -> dict[str, Any]:
        return {
            "added": list(self.added),
            "removed": list(self.removed),
            "changed": [c.to_json() for c in self.changed],
        }

    def render(self) -> str:
        lines = [f"+ {shown(name)}" for name in self.added]
        lines += [f"- {shown(name)}" for name in self.removed]
        for change in self.changed:
            lines.append(f"~ {shown(change.name)}")
            lines += [f"    {shown(c.render())}" for c in change.changes]
        return "\n".join(lines) + ("\n" if lines else "")


def diff_catalogs(before: Catalog, after: Catalog) -> CatalogDiff:
    """Models only in ``after`` (added), only in ``before`` (removed), and in both but
    different, each in the order its catalog holds it. A model moving between
    declared and runtime is a change of its ``declared`` field."""
    old = {m.name: m for m in before.models()}
    new = {m.name: m for m in after.models()}
    changed = []
    for name, model in new.items():
        if name not in old:
            continue
        changes = list(diff_models(old[name], model))
        was, now = before.is_declared(name), after.is_declared(name)
        if was != now:
            changes.append(FieldChange("declared", was, now))
        if changes:
            changed.append(ModelChange(name, tuple(changes)))
    return CatalogDiff(
        added=tuple(n for n in new if n not in old),
        removed=tuple(n for n in old if n not in new),
        changed=tuple(changed),
    )


def diff_models(before: Model, after: Model) -> tuple[FieldChange, ...]:
    """Every field that differs between two definitions, by dotted path."""
    out: list[FieldChange] = []
    _walk("", before.to_definition(), after.to_definition(), out)
    return tuple(out)


def _walk(path: str, a: Any, b: Any, out: list[FieldChange]) -> None:
    if a == b:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            _walk(_join(path, key), a.get(key, ABSENT), b.get(key, ABSENT), out)
        return
    if path == "profiles" and isinstance(a, list) and isinstance(b, list):
        _walk_profiles(a, b, out)
        return
    out.append(FieldChange(path, a, b))


def _walk_profiles(a: list[Any], b: list[Any], out: list[FieldChange]) -> None:
    old = {p["name"]: p for p in a}
    new = {p["name"]: p for p in b}
    for name, profile in old.items():
        _walk(f"profiles[{name}]", profile, new.get(name, ABSENT), out)
    for name, profile in new.items():
        if name not in old:
            out.append(FieldChange(f"profiles[{name}]", ABSENT, profile))
    kept_old = [n for n in old if n in new]
    kept_new = [n for n in new if n in old]
    if kept_old != kept_new:
        out.append(FieldChange("profiles (order)", kept_old, kept_new))


def _join(path: str, key: str) -> str:
    # Keys of env and node_selector may hold dots: bracket those, as profiles are.
    if "." in key or "[" in key:
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _show(value: Any) -> str:
    if value is ABSENT:
        return "(absent)"
    return json.dumps(value, sort_keys=True)
