"""CatalogState.check_replace / replace: a runtime model's definition replaced in one step.

A replacement is judged as an addition is, against the catalog as it would be
after it; configuration still wins, and no model is left falling back to a
name the new definition drops.
"""

from __future__ import annotations

import pytest

from catalog import Catalog, CatalogError, CatalogState, Model
from tests.unit.catalog.catalog_builders import model

CONFIG = "/etc/llmgw/catalog.yaml"


@pytest.fixture
def state() -> CatalogState:
    """Declared 'prod' (alias 'prod-latest'); runtime 'trial' (alias 't') and 'other'."""
    declared = Catalog.build([model("prod", aliases=["prod-latest"])])
    state = CatalogState(declared, config_path=CONFIG)
    for m in (model("trial", aliases=["t"]), model("other", fallbacks=["prod"])):
        state.check_add([m])
        state.add(m)
    return state


def replace(state: CatalogState, new: Model) -> Model:
    old = state.check_replace(new)
    state.replace(new)
    return old


def refusal(state: CatalogState, new: Model) -> CatalogError:
    before = state.snapshot()
    with pytest.raises(CatalogError) as caught:
        state.check_replace(new)
    assert state.snapshot() == before
    return caught.value


def test_a_replacement_keeps_the_models_place_and_swaps_its_definition(
    state: CatalogState,
) -> None:
    old = replace(state, model("trial", aliases=["t", "t2"], source="org/trial-v2"))
    assert old.source == "org/trial"
    catalog = state.snapshot()
    assert [m.name for m in catalog.models()] == ["prod", "trial", "other"]
    found = catalog.resolve("t2")
    assert found is not None and found.source == "org/trial-v2"
    assert catalog.canonical("t") == "trial"


def test_a_declared_model_cannot_be_replaced_and_the_error_names_the_file(
    state: CatalogState,
) -> None:
    err = refusal(state, model("prod", aliases=["prod-latest"], source="laptop/prod"))
    assert err.model == "prod"
    assert f"Change it in {CONFIG} instead" in str(err)
    assert "cannot be replaced at runtime" in str(err)


def test_replacing_an_absent_model_or_by_an_alias_is_refused(state: CatalogState) -> None:
    assert "nothing to replace" in str(refusal(state, model("ghost")))
    err = refusal(state, model("t"))
    assert "alias of model 'trial'" in str(err)


def test_a_new_alias_taken_by_another_model_or_by_configuration_is_refused(
    state: CatalogState,
) -> None:
    err = refusal(state, model("trial", aliases=["other"]))
    assert (err.model, err.field) == ("trial", "aliases")
    assert "model 'other'" in str(err)
    err = refusal(state, model("trial", aliases=["prod-latest"]))
    assert f"declared model 'prod' in {CONFIG}" in str(err)


def test_dropping_an_alias_another_model_falls_back_by_is_refused_naming_it(
    state: CatalogState,
) -> None:
    dependent = model("dep", fallbacks=["t"])
    state.check_add([dependent])
    state.add(dependent)
    err = refusal(state, model("trial", aliases=["t-new"]))
    assert (err.model, err.field) == ("trial", "aliases")
    assert "'dep' falls back to it" in str(err) and "'t'" in str(err)
    # Keeping the alias, the rest may change freely.
    replace(state, model("trial", aliases=["t", "t-new"], source="org/v2"))


def test_a_fallback_to_an_alias_the_replacement_drops_is_missing(state: CatalogState) -> None:
    err = refusal(state, model("trial", fallbacks=["t"]))
    assert (err.model, err.field) == ("trial", "fallbacks")
    assert "fallback 't' is not in the catalog" in str(err)
    err = refusal(state, model("trial", fallbacks=["nope"]))
    assert "fallback 'nope' is not in the catalog" in str(err)


def test_a_replacement_may_point_a_fallback_forward_and_the_state_restores(
    state: CatalogState,
) -> None:
    # 'trial' was accepted before 'other'; now it falls back to it, and 'other' to it: a
    # cycle, which declared models may form too. A snapshot of this restores.
    replace(state, model("trial", aliases=["t"], fallbacks=["other"]))
    replace(state, model("other", fallbacks=["t"]))
    runtime = state.runtime_models()
    declared = Catalog.build([model("prod", aliases=["prod-latest"])])
    restored = CatalogState.restore(declared, runtime, config_path=CONFIG)
    assert restored.snapshot() == state.snapshot()
    # Each now holds the other: neither can be removed until a fallback changes.
    with pytest.raises(CatalogError, match="falls back to it"):
        restored.check_remove("other")


def test_dependents_stay_linked_across_a_replacement(state: CatalogState) -> None:
    dependent = model("dep", fallbacks=["trial"])
    state.check_add([dependent])
    state.add(dependent)
    replace(state, model("trial", source="org/v2"))
    with pytest.raises(CatalogError, match="'dep' falls back to it"):
        state.check_remove("trial")
    # And a replaced model that no longer falls back releases its target.
    replace(state, model("other"))
    replace(state, model("dep"))
    state.check_remove("trial")
