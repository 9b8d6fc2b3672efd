"""Diffs between two catalogs: what an auditor reads to see what changed between two days."""

from __future__ import annotations

from typing import Any

from catalog import Catalog, CatalogState, parse_model
from catalog.changes.diff import ABSENT, FieldChange, diff_catalogs, diff_models
from catalog.changes.digest import catalog_digest
from tests.support import definition


def _model(name: str, **kwargs: Any) -> Any:
    return parse_model(definition(name, **kwargs))


def _runtime(*models: Any) -> Catalog:
    return Catalog.build(models, declared=False)


def test_models_added_and_removed_are_listed_in_catalog_order() -> None:
    before = _runtime(_model("a"), _model("b"), _model("c"))
    after = _runtime(_model("a"), _model("d"), _model("e"))
    diff = diff_catalogs(before, after)
    assert diff.added == ("d", "e")
    assert diff.removed == ("b", "c")
    assert diff.changed == ()
    assert diff.render() == "+ d\n+ e\n- b\n- c\n"


def test_identical_catalogs_have_an_empty_diff() -> None:
    catalog = _runtime(_model("a", aliases=["x"]))
    diff = diff_catalogs(catalog, _runtime(_model("a", aliases=["x"])))
    assert diff.empty
    assert diff.render() == ""
    assert diff.to_json() == {"added": [], "removed": [], "changed": []}


def test_a_changed_profile_field_is_named_by_profile_name_and_dotted_path() -> None:
    before = _model("m", profiles=[{"name": "t4", "gpu_class": "T4", "tp": 1}])
    after = _model("m", profiles=[{"name": "t4", "gpu_class": "T4", "tp": 2}])
    changes = diff_models(before, after)
    assert FieldChange("profiles[t4].tp", 1, 2) in changes
    # Derived defaults move with it, and are reported too: they are what runs.
    assert FieldChange("profiles[t4].gpus_per_node", 1, 2) in changes
    assert "profiles[t4].tp: 1 -> 2" in [c.render() for c in changes]


def test_nested_fields_are_dotted_paths() -> None:
    before = _model("m", scaling={"min": 1}, slo={"ttft_p99": "2s"})
    after = _model("m", scaling={"min": 3}, slo={"ttft_p99": "1500ms"})
    rendered = [c.render() for c in diff_models(before, after)]
    assert 'slo.ttft_p99: "2s" -> "1s500ms"' in rendered
    assert "scaling.min: 1 -> 3" in rendered
    assert "scaling.max: 1 -> 3" in rendered


def test_profiles_are_matched_by_name_so_an_insert_is_one_added_profile() -> None:
    a = {"name": "a", "gpu_class": "A100"}
    b = {"name": "b", "gpu_class": "T4"}
    c = {"name": "c", "gpu_class": "H100"}
    changes = diff_models(_model("m", profiles=[a, b]), _model("m", profiles=[c, a]))
    paths = {ch.path: ch for ch in changes}
    assert set(paths) == {"profiles[b]", "profiles[c]"}
    assert paths["profiles[c]"].before is ABSENT
    assert paths["profiles[c]"].after["gpu_class"] == "H100"
    assert paths["profiles[b]"].after is ABSENT
    assert paths["profiles[b]"].to_json()["after"] is None
    assert [ch.render() for ch in changes] == ["profiles[b]: removed", "profiles[c]: added"]


def test_a_reordering_of_profiles_is_reported_on_its_own() -> None:
    a = {"name": "a", "gpu_class": "A100"}
    b = {"name": "b", "gpu_class": "T4"}
    changes = diff_models(_model("m", profiles=[a, b]), _model("m", profiles=[b, a]))
    assert changes == (FieldChange("profiles (order)", ["a", "b"], ["b", "a"]),)


def test_env_keys_are_paths_and_dotted_keys_are_bracketed() -> None:
    before = _model("m", profiles=[{"name": "p", "gpu_class": "A100", "env": {"A": "1"}}])
    after = _model(
        "m", profiles=[{"name": "p", "gpu_class": "A100", "env": {"A": "2", "x.y": "z"}}]
    )
    rendered = [c.render() for c in diff_models(before, after)]
    assert rendered == ['profiles[p].env.A: "1" -> "2"', 'profiles[p].env[x.y]: (absent) -> "z"']


def test_a_model_moving_into_configuration_is_a_change_of_declared() -> None:
    trial = _model("trial")
    before = Catalog.build([_model("base")], declared=True)
    before = _merge(before, trial)
    after = Catalog.build([_model("base"), trial], declared=True)
    diff = diff_catalogs(before, after)
    assert diff.added == diff.removed == ()
    assert diff.changed[0].name == "trial"
    assert diff.changed[0].changes == (FieldChange("declared", False, True),)
    assert diff.to_json()["changed"] == [
        {"model": "trial", "changes": [{"path": "declared", "before": False, "after": True}]}
    ]


def test_the_digest_covers_definitions_and_origin_not_formatting() -> None:
    one = Catalog.build([_model("a", scaling={"min": 1})])
    same = Catalog.build([parse_model({**definition("a"), "scaling": {"max": 1, "min": 1}})])
    assert catalog_digest(one) == catalog_digest(same)
    assert catalog_digest(one) != catalog_digest(Catalog.build([_model("a")], declared=False))
    assert catalog_digest(one) != catalog_digest(Catalog.build([_model("a", scaling={"min": 2})]))


def _merge(declared: Catalog, runtime: Any) -> Catalog:
    state = CatalogState(declared)
    state.add(runtime)
    return state.snapshot()
