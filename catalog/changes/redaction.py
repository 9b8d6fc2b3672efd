"""A catalog diff with secret-looking env values hidden (``secrecy.secrets.redact``). Pure."""

from __future__ import annotations

from dataclasses import replace

from catalog.changes.diff import CatalogDiff, FieldChange, ModelChange
from catalog.secrecy.secrets import redact


def redact_diff(diff: CatalogDiff) -> CatalogDiff:
    """``diff`` with the values ``redact`` hides hidden in each field change too."""

    def change(c: FieldChange) -> FieldChange:
        shown = redact({"path": c.path, "before": c.before, "after": c.after})
        return FieldChange(c.path, shown["before"], shown["after"])

    return replace(
        diff,
        changed=tuple(
            ModelChange(m.name, tuple(change(c) for c in m.changes)) for m in diff.changed
        ),
    )
