"""``validate`` remembers what passed (profile lists, and everything but the names and the
source, by identity of the shared sections): a definition that shares them and breaks a
name is refused in the same words as with nothing remembered."""

from __future__ import annotations

from typing import Any

import pytest

from catalog import CatalogError, Model, parse_model
from catalog.definition import model_rules as catalog_model
from catalog.definition.model_rules import validate
from tests.support import definition

VARIANTS: list[dict[str, Any]] = [
    {"name": " good"},
    {"name": "no spaces allowed"},
    {"name": "g"},  # its own alias
    {"aliases": ("good",)},
    {"aliases": ("x", "x")},
    {"aliases": ("x", "X")},
    {"aliases": ("not an alias!",)},
    {"aliases": ("",)},
    {"fallbacks": ("not a name!",)},
    {"source": ""},
    {"source": "two\nlines"},
    {"context_length": -1},
    {"max_output": 10, "context_length": 5},
    {"routing_profile": "no spaces"},
]


def _forget() -> None:
    catalog_model._VALID_REST.clear()
    catalog_model._VALID_PROFILES.clear()
    catalog_model._NORMAL_PROFILES.clear()


def _refusal(model: Model) -> tuple[str, str | None, str | None, str | None]:
    with pytest.raises(CatalogError) as caught:
        validate(model)
    exc = caught.value
    return (str(exc), exc.model, exc.profile, exc.field)


@pytest.mark.parametrize("update", VARIANTS)
def test_a_variant_of_a_remembered_definition_is_refused_in_the_same_words(
    update: dict[str, Any],
) -> None:
    _forget()
    good = parse_model(definition("good", aliases=["g"]))
    validate(good)
    assert catalog_model._VALID_REST, "the good definition is remembered"
    bad = good.model_copy(update=update)  # shares the sections: the memo answers for them
    remembered = _refusal(bad)
    _forget()
    assert _refusal(bad) == remembered


def test_a_bad_profile_list_is_never_remembered() -> None:
    _forget()
    bad = parse_model(definition("good")).model_copy()
    profile = bad.profiles[0].model_copy(update={"name": "not a profile name!"})
    bad = bad.model_copy(update={"profiles": (profile,)})
    first = _refusal(bad)
    assert _refusal(bad) == first
    assert id(bad.profiles) not in catalog_model._VALID_PROFILES
