"""The catalog domain: model definitions, their rules, and the catalog they form.

Pure: no database, no logging, no clock. Everything here can be tested and
replayed exactly.

The names below are loaded on first use (PEP 562): importing a small module of
the package (``catalog.text``, ``catalog.durations``) must not load pydantic and
every model, since the command line imports those for each command.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from catalog.catalog import Catalog
    from catalog.declared import load_declared, load_definitions, parse_definitions, read_data
    from catalog.errors import CatalogError, NotInCatalog, RefusalKind, RuleConflict
    from catalog.model import SLO, Capabilities, Model, Profile, Rollout, Scaling, cpu_capable
    from catalog.parse import parse_model
    from catalog.state import CatalogState
    from catalog.views import EngineProfile, PlacementProfile

_WHERE = {
    "Catalog": "catalog.catalog",
    "load_declared": "catalog.declared",
    "load_definitions": "catalog.declared",
    "parse_definitions": "catalog.declared",
    "read_data": "catalog.declared",
    "CatalogError": "catalog.errors",
    "NotInCatalog": "catalog.errors",
    "RefusalKind": "catalog.errors",
    "RuleConflict": "catalog.errors",
    "SLO": "catalog.model",
    "Capabilities": "catalog.model",
    "Model": "catalog.model",
    "Profile": "catalog.model",
    "Rollout": "catalog.model",
    "Scaling": "catalog.model",
    "cpu_capable": "catalog.model",
    "parse_model": "catalog.parse",
    "CatalogState": "catalog.state",
    "EngineProfile": "catalog.views",
    "PlacementProfile": "catalog.views",
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
