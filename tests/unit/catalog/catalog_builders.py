"""Model definitions as an operator writes them, and a helper to capture a refusal."""

from __future__ import annotations

from typing import Any

import pytest

from catalog import CatalogError, Model, parse_model


def gpu_profile(name: str = "a100", **fields: Any) -> dict[str, Any]:
    """A GPU profile: names a gpu_class, engine left to its default unless given."""
    return {"name": name, "gpu_class": "A100", **fields}


def cpu_profile(name: str = "cpu", **fields: Any) -> dict[str, Any]:
    """A CPU profile: llama.cpp with no gpu_class."""
    return {"name": name, "engine": "llamacpp", **fields}


def definition(
    name: str = "llama",
    *,
    profiles: list[dict[str, Any]] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A small valid raw definition; keyword arguments add or replace top-level fields."""
    return {
        "name": name,
        "source": f"org/{name}",
        "profiles": [gpu_profile()] if profiles is None else profiles,
        **fields,
    }


def model(name: str = "llama", **fields: Any) -> Model:
    return parse_model(definition(name, **fields))


def refusal(raw: object, *, origin: str = "") -> CatalogError:
    """The CatalogError parse_model raises for ``raw``; fails the test if it accepts it."""
    with pytest.raises(CatalogError) as caught:
        parse_model(raw, origin=origin)
    return caught.value


def where(err: CatalogError) -> tuple[str | None, str | None, str | None]:
    """The (model, profile, field) a refusal points at."""
    return err.model, err.profile, err.field
