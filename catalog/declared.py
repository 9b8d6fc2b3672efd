"""Model definitions from files: the declared ``catalog.yaml`` and runtime definition files.

Both hold the same shape, ``models: [...]`` (a runtime file may also hold a
single model at the top level), so that a model tried at runtime can be moved
into reviewed configuration by copying it.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from catalog.catalog import Catalog
from catalog.errors import CatalogError
from catalog.model import Model
from catalog.parse import parse_model

# libyaml's parser when PyYAML was built with it: several times faster on a
# catalog of thousands of models, and every command reads the declared file.
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_SafeLoader):  # type: ignore[valid-type,misc]  # chosen at import
    """A YAML loader that refuses a key written twice in one mapping.

    PyYAML silently keeps the last of two equal keys; in a reviewed
    configuration file that is a lost edit nobody sees.
    """


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if not isinstance(key, Hashable):
            continue  # construct_mapping refuses it, as a YAML error
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is written twice in one mapping", key_node.start_mark
            )
        seen.add(key)
    mapping: dict[Any, Any] = loader.construct_mapping(node)
    return mapping


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def read_data(text: str, origin: str) -> Any:
    """Parse YAML or JSON text (JSON is YAML, but its own parser gives better errors)."""
    stripped = text.lstrip()
    try:
        if stripped.startswith(("{", "[")):
            try:
                return json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
            except json.JSONDecodeError as json_error:
                # Flow-style YAML (`{name: x}`) is not JSON; if it is not YAML
                # either, the JSON parser's complaint is the more precise one.
                try:
                    return yaml.load(text, Loader=_StrictLoader)
                except yaml.YAMLError:
                    raise json_error from None
        return yaml.load(text, Loader=_StrictLoader)
    except (yaml.YAMLError, json.JSONDecodeError, _DuplicateKey) as exc:
        raise CatalogError(f"{origin}: not valid YAML or JSON: {exc}") from None


class _DuplicateKey(ValueError):
    pass


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON's counterpart of ``_StrictLoader``: a key written twice is refused, not dropped."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} is written twice in one object")
        out[key] = value
    return out


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
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the declared catalog: {exc.strerror}") from None
    models = parse_definitions(read_data(text, str(path)), str(path), allow_single=False)
    try:
        return Catalog.build(models, declared=True)
    except CatalogError as exc:
        raise CatalogError(
            f"{path}: {exc.message}", model=exc.model, profile=exc.profile, field=exc.field
        ) from None


def load_definitions(path: Path) -> list[Model]:
    """Load a runtime definition file (YAML or JSON)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the definition file: {exc.strerror}") from None
    models = parse_definitions(read_data(text, str(path)), str(path))
    if not models:
        raise CatalogError(f"{path}: holds no model definitions")
    return models
