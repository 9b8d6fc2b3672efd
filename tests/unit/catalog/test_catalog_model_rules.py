"""The rules of one model definition: its defaults (normalisation) and its refusals (validation).

Each rule comes from the Go seed's ``normalize``/``validate``; a refusal must point the
operator at the model, the profile and the field to edit.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from catalog import Model, parse_model
from catalog.definition.model_rules import normalize
from tests.unit.catalog.catalog_builders import (
    cpu_profile,
    definition,
    gpu_profile,
    refusal,
    where,
)


def only_profile(**fields: Any) -> Any:
    """The single profile of a parsed model with one GPU profile carrying ``fields``."""
    return parse_model(definition(profiles=[gpu_profile(**fields)])).profiles[0]


def normalized(raw: dict[str, Any]) -> Model:
    """Defaults applied without validation: what a definition becomes before it is judged."""
    return normalize(Model.model_validate(raw))


# -- required fields ----------------------------------------------------------------------


def test_a_model_without_a_name_is_refused() -> None:
    raw = definition()
    del raw["name"]
    err = refusal(raw)
    assert "has no name" in str(err)
    assert err.field == "name"


@pytest.mark.parametrize("blank", ["", "   "])
def test_a_blank_name_counts_as_no_name(blank: str) -> None:
    err = refusal(definition(blank))
    assert "has no name" in str(err)
    assert err.field == "name"


def test_a_name_with_surrounding_spaces_is_refused_because_clients_would_never_match_it() -> None:
    err = refusal(definition(" llama"))
    assert where(err) == (" llama", None, "name")
    assert "leading or trailing spaces" in str(err)


def test_a_model_without_a_source_is_refused() -> None:
    raw = definition("llama")
    del raw["source"]
    err = refusal(raw)
    assert where(err) == ("llama", None, "source")
    assert "model 'llama': source is required" in str(err)


@pytest.mark.parametrize("profiles", [None, []], ids=["absent", "empty"])
def test_a_model_without_profiles_is_refused(profiles: list[Any] | None) -> None:
    raw = definition("llama")
    if profiles is None:
        del raw["profiles"]
    else:
        raw["profiles"] = profiles
    err = refusal(raw)
    assert where(err) == ("llama", None, "profiles")
    assert "at least one profile is required" in str(err)


# -- scaling ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scaling", "expected"),
    [
        (None, (0, 1)),
        ({"min": -3}, (0, 1)),
        ({"min": 0, "max": 0}, (0, 1)),
        ({"min": 3}, (3, 3)),
        ({"min": 2, "max": 5}, (2, 5)),
        ({"min": -2, "max": 4}, (0, 4)),
    ],
    ids=["absent", "negative-min", "zeros", "min-only", "both", "negative-min-with-max"],
)
def test_scaling_defaults_clamp_min_at_zero_and_default_max_to_min_or_one(
    scaling: dict[str, int] | None, expected: tuple[int, int]
) -> None:
    raw = definition() if scaling is None else definition(scaling=scaling)
    m = parse_model(raw)
    assert (m.scaling.min, m.scaling.max) == expected


def test_scaling_max_below_min_is_refused_quoting_both() -> None:
    err = refusal(definition("llama", scaling={"min": 3, "max": 2}))
    assert where(err) == ("llama", None, "scaling.max")
    assert "scaling.max 2 is below scaling.min 3" in str(err)


def test_a_negative_scaling_max_is_refused_rather_than_defaulted() -> None:
    err = refusal(definition("llama", scaling={"max": -1}))
    assert err.field == "scaling.max"
    assert "scaling.max -1 is below scaling.min 0" in str(err)


# -- profile names -----------------------------------------------------------------------


def test_a_profile_without_a_name_is_refused() -> None:
    err = refusal(definition("llama", profiles=[{"gpu_class": "A100"}]))
    assert where(err) == ("llama", None, "profiles.name")
    assert "a profile has no name" in str(err)


def test_profile_names_must_be_unique_within_a_model() -> None:
    err = refusal(definition("llama", profiles=[gpu_profile("fast"), gpu_profile("fast", tp=2)]))
    assert where(err) == ("llama", "fast", "profiles.name")
    assert "profile 'fast' is declared twice" in str(err)


# -- profile defaults ----------------------------------------------------------------------


def test_engine_defaults_to_vllm() -> None:
    assert only_profile().engine == "vllm"


def test_an_explicit_engine_is_kept() -> None:
    assert only_profile(engine="sglang").engine == "sglang"


@pytest.mark.parametrize("tp", [None, 0, -2])
def test_tp_defaults_to_one(tp: int | None) -> None:
    fields = {} if tp is None else {"tp": tp}
    assert only_profile(**fields).tp == 1


@pytest.mark.parametrize("nodes", [None, 0, -1])
def test_nodes_defaults_to_one(nodes: int | None) -> None:
    fields = {} if nodes is None else {"nodes": nodes}
    assert only_profile(**fields).nodes == 1


@pytest.mark.parametrize("timeout", [None, 0, "0s"])
def test_startup_timeout_defaults_to_twenty_minutes(timeout: object) -> None:
    fields = {} if timeout is None else {"startup_timeout": timeout}
    assert only_profile(**fields).startup_timeout == timedelta(minutes=20)


def test_an_explicit_startup_timeout_is_kept() -> None:
    assert only_profile(startup_timeout="45m").startup_timeout == timedelta(minutes=45)


@pytest.mark.parametrize("weight", [None, 0, -1.5])
def test_weight_defaults_to_one(weight: float | None) -> None:
    fields = {} if weight is None else {"weight": weight}
    assert only_profile(**fields).weight == 1.0


def test_an_explicit_weight_is_kept_and_an_int_weight_is_a_number() -> None:
    assert only_profile(weight=2.5).weight == 2.5
    assert only_profile(weight=3).weight == 3.0


@pytest.mark.parametrize(
    ("tp", "nodes", "expected"),
    [(None, None, 1), (4, None, 4), (8, 2, 4), (1, 2, 1), (3, 2, 1)],
    ids=["defaults", "single-node", "two-nodes", "at-least-one", "rounds-down"],
)
def test_gpus_per_node_defaults_to_tp_over_nodes_and_at_least_one(
    tp: int | None, nodes: int | None, expected: int
) -> None:
    profile: dict[str, Any] = {"name": "p", "gpu_class": "A100"}
    if tp is not None:
        profile["tp"] = tp
    if nodes is not None:
        profile["nodes"] = nodes
    p = normalized(definition(profiles=[profile])).profiles[0]
    assert p.gpus_per_node == expected


def test_an_explicit_gpus_per_node_is_kept() -> None:
    p = only_profile(tp=2, pp=2, gpus_per_node=4)
    assert p.gpus_per_node == 4


def test_a_cpu_profile_asks_for_no_gpus_even_when_gpus_per_node_is_written() -> None:
    m = parse_model(definition(profiles=[cpu_profile(gpus_per_node=4, tp=2)]))
    p = m.profiles[0]
    assert p.cpu_only
    assert p.gpus_per_node == 0


def test_llamacpp_with_a_gpu_class_is_a_gpu_profile_with_the_gpu_rules() -> None:
    p = parse_model(definition(profiles=[cpu_profile(gpu_class="A100", tp=2)])).profiles[0]
    assert not p.cpu_only
    assert p.gpus_per_node == 2


def test_normalize_leaves_its_own_output_unchanged() -> None:
    m = normalized(
        definition(
            scaling={"min": -1},
            profiles=[gpu_profile("g", tp=8, nodes=2), cpu_profile("c", gpus_per_node=3)],
        )
    )
    assert normalize(m) == m


# -- which profiles may omit gpu_class -------------------------------------------------------


@pytest.mark.parametrize("engine", [None, "vllm", "sglang", "sim"])
def test_only_llamacpp_may_leave_out_gpu_class(engine: str | None) -> None:
    profile: dict[str, Any] = {"name": "p"}
    if engine is not None:
        profile["engine"] = engine
    err = refusal(definition("llama", profiles=[profile]))
    assert where(err) == ("llama", "p", "gpu_class")
    assert f"gpu_class is required for engine {engine or 'vllm'!r}" in str(err)


def test_a_typo_in_gpu_class_does_not_quietly_turn_a_profile_into_a_cpu_one() -> None:
    err = refusal(definition("llama", profiles=[cpu_profile("p", gpu_clas="A100")]))
    assert (err.model, err.profile) == ("llama", "p")
    assert "did you mean 'gpu_class'" in str(err)


def test_a_cpu_profile_cannot_span_nodes() -> None:
    err = refusal(definition("tiny", profiles=[cpu_profile("cpu", nodes=2)]))
    assert where(err) == ("tiny", "cpu", "nodes")
    assert "a CPU profile cannot span 2 nodes" in str(err)


def test_a_cpu_profile_on_one_node_is_accepted() -> None:
    p = parse_model(definition(profiles=[cpu_profile(nodes=1)])).profiles[0]
    assert (p.nodes, p.gpus_per_node, p.gpu_class) == (1, 0, "")


# -- GPU arithmetic ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"tp": 4},
        {"tp": 8, "nodes": 2},
        {"tp": 4, "pp": 2, "gpus_per_node": 8},
        {"tp": 4, "pp": 2, "nodes": 2, "gpus_per_node": 4},
        {"tp": 2, "pp": 4, "nodes": 4, "gpus_per_node": 2},
        {"tp": 2, "pp": 0, "gpus_per_node": 2},
        {"tp": 2, "pp": -3, "gpus_per_node": 2},
    ],
    ids=["tp", "multi-node", "pp", "pp-multi-node", "pp-across-4", "pp-zero", "pp-negative"],
)
def test_nodes_times_gpus_per_node_equal_to_tp_times_pp_is_accepted(fields: dict[str, int]) -> None:
    p = only_profile(**fields)
    assert p.nodes * p.gpus_per_node == p.tp * max(p.pp, 1)


@pytest.mark.parametrize(
    ("fields", "quoted"),
    [
        ({"tp": 4, "gpus_per_node": 2}, "1 nodes x 2 GPUs does not match TP 4 x PP 1"),
        ({"tp": 2, "pp": 2}, "1 nodes x 2 GPUs does not match TP 2 x PP 2"),
        ({"tp": 4, "pp": 2, "nodes": 2}, "2 nodes x 2 GPUs does not match TP 4 x PP 2"),
        ({"tp": 1, "nodes": 2}, "2 nodes x 1 GPUs does not match TP 1 x PP 1"),
        ({"tp": 3, "nodes": 2}, "2 nodes x 1 GPUs does not match TP 3 x PP 1"),
    ],
    ids=["tp-mismatch", "pp-not-counted", "pp-multi-node", "too-many-nodes", "indivisible"],
)
def test_gpu_arithmetic_that_does_not_add_up_is_refused_quoting_the_numbers(
    fields: dict[str, int], quoted: str
) -> None:
    err = refusal(definition("big", profiles=[gpu_profile("h100", **fields)]))
    assert where(err) == ("big", "h100", "gpus_per_node")
    assert f"model 'big' profile 'h100': {quoted}" in str(err)


def test_a_later_profile_is_checked_too_and_named() -> None:
    profiles = [gpu_profile("ok", tp=2), gpu_profile("bad", tp=2, gpus_per_node=3)]
    err = refusal(definition("big", profiles=profiles))
    assert where(err) == ("big", "bad", "gpus_per_node")


# -- rules the port adds beyond the seed ---------------------------------------------------


@pytest.mark.parametrize("aliases", [["llama"], [""], ["x", "x"]], ids=["own-name", "empty", "dup"])
def test_an_alias_that_is_empty_repeated_or_the_model_name_is_refused(aliases: list[str]) -> None:
    err = refusal(definition("llama", aliases=aliases))
    assert where(err) == ("llama", None, "aliases")


def test_a_negative_min_memory_is_refused() -> None:
    err = refusal(definition("llama", profiles=[gpu_profile("p", min_memory_gb=-1)]))
    assert where(err) == ("llama", "p", "min_memory_gb")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"context_length": -1}, "context_length"),
        ({"max_output": -1}, "max_output"),
        ({"context_length": 4096, "max_output": 8192}, "max_output"),
    ],
)
def test_context_limits_that_no_request_could_meet_are_refused(
    fields: dict[str, Any], field: str
) -> None:
    err = refusal(definition("llama", **fields))
    assert where(err) == ("llama", None, field)


def test_max_output_with_an_unknown_context_length_is_accepted() -> None:
    assert parse_model(definition(max_output=8192)).max_output == 8192


# -- simulated -----------------------------------------------------------------------------


def test_a_model_whose_every_profile_is_sim_is_simulated() -> None:
    profiles = [gpu_profile("a", engine="sim"), gpu_profile("b", engine="sim")]
    assert parse_model(definition(profiles=profiles)).simulated


def test_one_real_profile_makes_a_model_not_simulated() -> None:
    profiles = [gpu_profile("a", engine="sim"), gpu_profile("b")]
    assert not parse_model(definition(profiles=profiles)).simulated


def test_a_model_with_no_profiles_is_not_simulated() -> None:
    assert not Model(name="empty", source="x").simulated


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ({"scaling": {"min": 10**12}}, "scaling.min", "more than 10000 replicas"),
        ({"scaling": {"min": 1, "max": 20_000}}, "scaling.max", "more than 10000 replicas"),
        ({"profiles": [{"name": "p", "gpu_class": "A100", "tp": 5000}]}, "tp", "more than 1024"),
        (
            {"profiles": [{"name": "p", "gpu_class": "A100", "weight": float("inf")}]},
            "weight",
            "not a finite number",
        ),
    ],
)
def test_numbers_no_real_definition_has_are_refused_as_typos(
    extra: dict[str, object], field: str, words: str
) -> None:
    from catalog import CatalogError, parse_model

    raw = {"name": "m", "source": "org/m", "profiles": [{"name": "p", "gpu_class": "A100"}]}
    with pytest.raises(CatalogError) as caught:
        parse_model({**raw, **extra})
    assert caught.value.field == field
    assert words in str(caught.value) and "'m'" in str(caught.value)
