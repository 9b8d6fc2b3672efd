"""The catalog domain: model definitions, their rules, and the catalog they form.

Pure: no database, no logging, no clock. Everything here can be tested and
replayed exactly.

Its rooms, from the ground up: ``errors`` (what the catalog raises), ``forms`` (printable
text, terminal-safe text, durations), ``secrecy`` (secrets held by reference),
``definition`` (one model, its own rules, the names it may use), ``whole`` (the catalog
and the rules between models), ``changes`` (diffs, redacted diffs, digests),
``reading`` (bounded documents, definitions from files), ``stored`` (stored definitions
decoded fast, for replay). Each floor imports only those below it
(tests/unit/test_architecture.py).

The names below are loaded on first use (PEP 562): importing a small module of
the package (``catalog.forms.text``, ``catalog.forms.durations``) must not load pydantic
and every model, since the command line imports those for each command.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from catalog.definition.model import (
        SLO,
        Capabilities,
        Model,
        Profile,
        Rollout,
        Scaling,
        cpu_capable,
    )
    from catalog.definition.parse import parse_model
    from catalog.definition.views import EngineProfile, PlacementProfile
    from catalog.errors import CatalogError, NotInCatalog, RefusalKind, RuleConflict
    from catalog.reading.declared import (
        load_declared,
        load_definitions,
        parse_definitions,
        read_data,
    )
    from catalog.whole.catalog import Catalog
    from catalog.whole.state import CatalogState

_WHERE = {
    "Catalog": "catalog.whole.catalog",
    "load_declared": "catalog.reading.declared",
    "load_definitions": "catalog.reading.declared",
    "parse_definitions": "catalog.reading.declared",
    "read_data": "catalog.reading.declared",
    "CatalogError": "catalog.errors",
    "NotInCatalog": "catalog.errors",
    "RefusalKind": "catalog.errors",
    "RuleConflict": "catalog.errors",
    "SLO": "catalog.definition.model",
    "Capabilities": "catalog.definition.model",
    "Model": "catalog.definition.model",
    "Profile": "catalog.definition.model",
    "Rollout": "catalog.definition.model",
    "Scaling": "catalog.definition.model",
    "cpu_capable": "catalog.definition.model",
    "parse_model": "catalog.definition.parse",
    "CatalogState": "catalog.whole.state",
    "EngineProfile": "catalog.definition.views",
    "PlacementProfile": "catalog.definition.views",
}

__all__ = [
    "SLO",
    "Capabilities",
    "Catalog",
    "CatalogError",
    "CatalogState",
    "EngineProfile",
    "Model",
    "NotInCatalog",
    "PlacementProfile",
    "Profile",
    "RefusalKind",
    "Rollout",
    "RuleConflict",
    "Scaling",
    "cpu_capable",
    "load_declared",
    "load_definitions",
    "parse_definitions",
    "parse_model",
    "read_data",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'catalog' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # once: the next lookup is a plain module attribute
    return value
