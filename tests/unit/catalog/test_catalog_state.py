"""CatalogState: runtime additions and removals judged against what is already accepted.

Configuration wins every conflict; a change is refused unless the catalog it leaves is
valid; a batch is all or nothing and comes back in an order replay can apply one by one.
"""

from __future__ import annotations

import pytest

from catalog import Catalog, CatalogError, CatalogState, Model
from tests.unit.catalog.catalog_builders import model

CONFIG = "/etc/llmgw/catalog.yaml"


@pytest.fixture
def state() -> CatalogState:
    """Declared: 'prod' (alias 'prod-latest') and 'backup'; nothing added at runtime yet."""
    declared = Catalog.build([model("prod", aliases=["prod-latest"]), model("backup")])
    return CatalogState(declared, config_path=CONFIG)


def add(state: CatalogState, *models: Model) -> tuple[Model, ...]:
    """Check and apply a batch the way the add command does."""
    ordered = state.check_add(models)
    for m in ordered:
        state.add(m)
    return ordered


def add_refusal(state: CatalogState, *models: Model) -> CatalogError:
    before = state.snapshot()
    with pytest.raises(CatalogError) as caught:
        state.check_add(models)
    assert state.snapshot() == before
    return caught.value


def remove_refusal(state: CatalogState, name: str) -> CatalogError:
    before = state.snapshot()
    with pytest.raises(CatalogError) as caught:
        state.check_remove(name)
    assert state.snapshot() == before
    return caught.value


def names(state: CatalogState) -> list[str]:
    return [m.name for m in state.snapshot().models()]


# -- configuration wins ------------------------------------------------------------------


def test_a_runtime_model_named_like_a_declared_one_is_refused_pointing_at_the_config_file(
    state: CatalogState,
) -> None:
    err = add_refusal(state, model("prod", source="laptop/prod"))
    assert (err.model, err.field) == ("prod", "name")
    message = str(err)
    assert "declared model 'prod'" in message
    assert CONFIG in message
    assert "configuration wins" in message
    assert "choose another name" in message
    assert state.resolve("prod") == model("prod", aliases=["prod-latest"])


def test_a_runtime_model_named_like_a_declared_alias_is_refused(state: CatalogState) -> None:
    err = add_refusal(state, model("prod-latest"))
    assert (err.model, err.field) == ("prod-latest", "name")
    assert "already the alias of declared model 'prod'" in str(err)
    assert CONFIG in str(err)


@pytest.mark.parametrize("alias", ["prod", "prod-latest"])
def test_a_runtime_alias_claiming_a_declared_name_or_alias_is_refused(
    state: CatalogState, alias: str
) -> None:
    err = add_refusal(state, model("experiment", aliases=[alias]))
    assert (err.model, err.field) == ("experiment", "aliases")
    assert f"alias {alias!r}" in str(err)
    assert CONFIG in str(err)
    assert "choose another alias" in str(err)
    holder = state.resolve(alias)
    assert holder is not None
    assert holder.name == "prod"


def test_a_declared_model_cannot_be_removed_and_the_refusal_says_to_edit_the_file(
    state: CatalogState,
) -> None:
    err = remove_refusal(state, "backup")
    assert err.model == "backup"
    message = str(err)
    assert f"declared in {CONFIG}" in message
    assert "would return on the next restart" in message
    assert f"Remove it from {CONFIG} instead" in message


# -- adding ------------------------------------------------------------------------------


def test_a_runtime_model_is_added_after_the_declared_ones_and_marked_runtime(
    state: CatalogState,
) -> None:
    add(state, model("experiment", aliases=["exp"], fallbacks=["prod-latest"]))
    snapshot = state.snapshot()
    assert names(state) == ["prod", "backup", "experiment"]
    assert snapshot.resolve("exp") == model(
        "experiment", aliases=["exp"], fallbacks=["prod-latest"]
    )
    assert not snapshot.is_declared("experiment")
    assert snapshot.is_declared("prod")
    assert snapshot.fallbacks_of("exp") == ("prod",)


def test_check_add_alone_changes_nothing(state: CatalogState) -> None:
    state.check_add([model("experiment")])
    assert "experiment" not in state


def test_a_runtime_name_already_added_is_refused_as_an_add_and_points_to_apply(
    state: CatalogState,
) -> None:
    add(state, model("experiment"))
    err = add_refusal(state, model("experiment", source="v2"))
    assert (err.model, err.field) == ("experiment", "name")
    assert "already in the catalog" in str(err)
    assert "apply the new definition" in str(err)
    state.check_remove("experiment")
    state.remove("experiment")
    add(state, model("experiment", source="v2"))
    assert state.resolve("experiment") == model("experiment", source="v2")


def test_a_runtime_alias_already_held_by_a_runtime_model_is_refused(state: CatalogState) -> None:
    add(state, model("a", aliases=["shared"]))
    err = add_refusal(state, model("b", aliases=["shared"]))
    assert (err.model, err.field) == ("b", "aliases")
    assert "already the alias of model 'a'" in str(err)


def test_a_runtime_name_equal_to_a_runtime_alias_is_refused(state: CatalogState) -> None:
    add(state, model("a", aliases=["shared"]))
    err = add_refusal(state, model("shared"))
    assert "already the alias of model 'a'" in str(err)


def test_a_runtime_model_whose_fallback_is_missing_is_refused(state: CatalogState) -> None:
    err = add_refusal(state, model("experiment", fallbacks=["prodd"]))
    assert (err.model, err.field) == ("experiment", "fallbacks")
    assert "fallback 'prodd' is not in the catalog" in str(err)


def test_a_batch_is_all_or_nothing(state: CatalogState) -> None:
    good, bad = model("fine"), model("clash", aliases=["backup"])
    state.check_add([good])  # acceptable on its own
    err = add_refusal(state, good, bad)
    assert err.model == "clash"
    assert "fine" not in state


def test_a_batch_member_may_fall_back_to_another_and_comes_back_in_dependency_order(
    state: CatalogState,
) -> None:
    a = model("a", fallbacks=["b-alias"])
    b = model("b", aliases=["b-alias"], fallbacks=["c", "prod"])
    c = model("c")
    d = model("d")
    ordered = state.check_add([a, d, b, c])
    assert [m.name for m in ordered] == ["c", "b", "a", "d"]
    # Replay judges one event at a time, so each model must be acceptable on its own
    # once those before it have been applied.
    for m in ordered:
        state.check_add([m])
        state.add(m)
    assert Catalog.build(state.snapshot().models(), declared=False).fallbacks_of("a") == ("b",)


def test_a_batch_without_dependencies_keeps_its_order(state: CatalogState) -> None:
    ordered = state.check_add([model("z"), model("y"), model("x", fallbacks=["prod"])])
    assert [m.name for m in ordered] == ["z", "y", "x"]


def test_a_fallback_cycle_within_a_batch_is_refused(state: CatalogState) -> None:
    err = add_refusal(state, model("a", fallbacks=["b"]), model("b", fallbacks=["a"]))
    assert err.field == "fallbacks"
    assert "cycle (a -> b -> a)" in str(err)


def test_a_model_falling_back_to_itself_in_a_batch_is_not_a_cycle(state: CatalogState) -> None:
    ordered = add(state, model("a", aliases=["aa"], fallbacks=["aa", "a"]))
    assert [m.name for m in ordered] == ["a"]


@pytest.mark.parametrize(
    "batch",
    [
        (model("dup"), model("dup", source="other")),
        (model("a", aliases=["dup"]), model("dup")),
        (model("a", aliases=["dup"]), model("b", aliases=["dup"])),
    ],
    ids=["name-twice", "alias-and-name", "alias-twice"],
)
def test_a_name_or_alias_used_twice_in_one_batch_is_refused(
    state: CatalogState, batch: tuple[Model, ...]
) -> None:
    err = add_refusal(state, *batch)
    assert "used twice in this change" in str(err)


# -- removing ----------------------------------------------------------------------------


def test_removing_a_model_that_is_not_there_is_refused(state: CatalogState) -> None:
    err = remove_refusal(state, "ghost")
    assert err.model == "ghost"
    assert "model 'ghost' is not in the catalog" in str(err)


def test_removing_by_alias_is_refused_with_the_canonical_name(state: CatalogState) -> None:
    add(state, model("experiment", aliases=["exp"]))
    err = remove_refusal(state, "exp")
    assert err.model == "experiment"
    assert "'exp' is an alias of model 'experiment'" in str(err)
    assert "remove the model by its name" in str(err)
    assert "`llmgw remove experiment`" in str(err)
    # Nothing was removed: the alias still leads to the model.
    assert state.resolve("exp") is not None


def test_a_removed_model_takes_its_aliases_with_it(state: CatalogState) -> None:
    add(state, model("experiment", aliases=["exp"]))
    state.check_remove("experiment")
    state.remove("experiment")
    assert state.resolve("exp") is None
    assert names(state) == ["prod", "backup"]
    add(state, model("other", aliases=["exp"]))


def test_removal_is_refused_while_a_fallback_points_at_it(state: CatalogState) -> None:
    add(state, model("target", aliases=["t"]), model("via-name", fallbacks=["target"]))
    err = remove_refusal(state, "target")
    assert (err.model, err.field) == ("target", "fallbacks")
    assert "'via-name' falls back to it" in str(err)
    assert "remove those models or change their fallbacks first" in str(err)


def test_a_removal_refusal_names_every_dependent_including_those_using_an_alias(
    state: CatalogState,
) -> None:
    add(state, model("target", aliases=["t"]))
    add(state, model("zed", fallbacks=["t"]), model("abe", fallbacks=["target"]))
    err = remove_refusal(state, "target")
    assert "'abe', 'zed' fall back to it" in str(err)


def test_removal_is_allowed_once_the_dependent_is_gone(state: CatalogState) -> None:
    add(state, model("target", aliases=["t"]), model("dependent", fallbacks=["t"]))
    remove_refusal(state, "target")
    state.check_remove("dependent")
    state.remove("dependent")
    state.check_remove("target")
    state.remove("target")
    assert names(state) == ["prod", "backup"]


def test_a_model_falling_back_to_itself_does_not_block_its_removal(state: CatalogState) -> None:
    add(state, model("loop", aliases=["l"], fallbacks=["loop", "l"]))
    state.check_remove("loop")
    state.remove("loop")
    assert "loop" not in state


def test_a_runtime_model_falling_back_to_a_declared_one_may_be_removed(
    state: CatalogState,
) -> None:
    add(state, model("experiment", fallbacks=["prod"]))
    state.check_remove("experiment")
    state.remove("experiment")
    assert names(state) == ["prod", "backup"]


# -- snapshots ---------------------------------------------------------------------------


def test_the_snapshot_of_a_declared_only_state_equals_the_declared_catalog() -> None:
    models = [
        model("b", aliases=["bee"], fallbacks=["a"]),
        model("a", fallbacks=["bee"]),
        model("c"),
    ]
    declared = Catalog.build(models)
    snapshot = CatalogState(declared).snapshot()
    assert snapshot == declared
    assert snapshot == Catalog.build(models)
    assert [m.name for m in snapshot.models()] == ["b", "a", "c"]
    assert snapshot.declared_names == frozenset({"a", "b", "c"})


def test_a_snapshot_does_not_change_when_the_state_does(state: CatalogState) -> None:
    before = state.snapshot()
    add(state, model("experiment", aliases=["exp"]))
    assert before.resolve("experiment") is None
    assert before.resolve("exp") is None
    assert len(before) == 2


def test_the_declared_catalog_stays_as_it_was_after_runtime_changes() -> None:
    declared = Catalog.build([model("prod")])
    state = CatalogState(declared)
    add(state, model("experiment"))
    assert declared.resolve("experiment") is None
    assert declared.names() == ["prod"]


def test_the_default_config_path_is_named_in_refusals() -> None:
    state = CatalogState(Catalog.build([model("prod")]))
    assert state.config_path == "catalog.yaml"
    with pytest.raises(CatalogError, match=r"catalog\.yaml"):
        state.check_remove("prod")


def test_a_long_fallback_chain_in_one_batch_is_ordered_without_exhausting_the_stack() -> None:
    from catalog import Catalog, CatalogState, parse_model

    chain = [
        parse_model(
            {
                "name": f"m{i}",
                "source": "org/m",
                "fallbacks": [f"m{i + 1}"] if i < 2999 else [],
                "profiles": [{"name": "p", "gpu_class": "A100"}],
            }
        )
        for i in range(3000)
    ]
    ordered = CatalogState(Catalog.build([])).check_add(chain)
    assert [m.name for m in ordered] == [f"m{i}" for i in reversed(range(3000))]
