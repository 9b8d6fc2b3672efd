"""The catalog domain: model definitions, their rules, and the catalog they form.

Pure: no database, no logging, no clock. Everything here can be tested and
replayed exactly.
"""

from catalog.catalog import Catalog
from catalog.declared import load_declared, load_definitions, parse_definitions, read_data
from catalog.errors import CatalogError, NotInCatalog, RefusalKind, RuleConflict
from catalog.model import SLO, Capabilities, Model, Profile, Rollout, Scaling, cpu_capable
from catalog.parse import parse_model
from catalog.state import CatalogState
from catalog.views import EngineProfile, PlacementProfile

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
