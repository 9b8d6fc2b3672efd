"""Model definitions from files: the declared ``catalog.yaml`` and runtime definition files.

Both hold the same shape, ``models: [...]`` (a runtime file may also hold a
single model at the top level), so that a model tried at runtime can be moved
into reviewed configuration by copying it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from catalog.definition.bind_args import check_no_bind_args
from catalog.definition.engines import check_engines
from catalog.definition.model import Model
from catalog.definition.parse import parse_model
from catalog.errors import CatalogError
from catalog.reading.documents import read_data, read_file
from catalog.secrecy.secrets import check_no_plain_secrets
from catalog.whole.catalog import Catalog

__all__ = ["load_declared", "load_definitions", "parse_definitions", "read_data"]


def parse_definitions(data: Any, origin: str, *, allow_single: bool = True) -> list[Model]:
    """Every model of a file: ``models: [...]``, or (for a runtime file) one model."""
    if isinstance(data, dict) and "models" in data:
        extra = sorted(set(data) - {"models"})
        if extra:
            raise CatalogError(
                f"{origin}: unknown top-level key(s) {', '.join(map(repr, extra))}; "
                "the file holds `models:` only"
            )
        items = data["models"]
        if items is None:
            return []
        if not isinstance(items, list):
            raise CatalogError(f"{origin}: `models` must be a list of model definitions")
        return [parse_model(item, origin=f"{origin} models[{i}]") for i, item in enumerate(items)]
    if allow_single and isinstance(data, dict):
        return [parse_model(data, origin=origin)]
    if allow_single and isinstance(data, list):
        return [parse_model(item, origin=f"{origin} [{i}]") for i, item in enumerate(data)]
    if data is None:
        return []
    raise CatalogError(f"{origin}: expected a mapping with `models: [...]`")


def load_declared(path: Path) -> Catalog:
    """Load and check the declared configuration; any refusal names the file to edit."""
    # A server rereads it on every change: it must be a regular file (``read_regular``).
    data = read_file(path, "declared catalog", regular=True)
    models = parse_definitions(data, str(path), allow_single=False)
    for i, m in enumerate(models):
        check_engines(m, f"{path} models[{i}]")
    try:
        for m in models:
            check_no_plain_secrets(m.profiles, m.name)
            check_no_bind_args(m.profiles, m.name)
        return Catalog.build(models, declared=True)
    except CatalogError as exc:
        raise CatalogError(
            f"{path}: {exc.message}", model=exc.model, profile=exc.profile, field=exc.field
        ) from None


def load_definitions(path: Path) -> list[Model]:
    """Load a runtime definition file (YAML or JSON)."""
    return require_models(
        parse_definitions(read_file(path, "definition file"), str(path)), str(path)
    )


def require_models(models: list[Model], origin: str) -> list[Model]:
    """``models``, refused when there are none: the one check every way of adding
    goes through (a file, a request body, the add command itself)."""
    if not models:
        raise CatalogError(f"{origin}: holds no model definitions")
    return models
