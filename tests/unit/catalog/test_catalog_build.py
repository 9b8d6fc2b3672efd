"""The immutable catalog: whole-catalog rules, lookups, rendering and the views others read."""

from __future__ import annotations

from datetime import timedelta

import pytest

from catalog import Catalog, CatalogError, Model, PlacementProfile
from tests.unit.catalog.catalog_builders import cpu_profile, gpu_profile, model


def build_refusal(models: list[Model]) -> CatalogError:
    with pytest.raises(CatalogError) as caught:
        Catalog.build(models)
    return caught.value


# -- whole-catalog rules -----------------------------------------------------------------


def test_a_model_name_declared_twice_is_refused() -> None:
    err = build_refusal([model("llama"), model("qwen"), model("llama", source="other")])
    assert (err.model, err.field) == ("llama", "name")
    assert "model 'llama' is declared twice" in str(err)


@pytest.mark.parametrize("alias_first", [True, False])
def test_an_alias_colliding_with_a_model_name_is_refused(alias_first: bool) -> None:
    claimant = model("llama", aliases=["qwen"])
    owner = model("qwen")
    err = build_refusal([claimant, owner] if alias_first else [owner, claimant])
    assert (err.model, err.field) == ("llama", "aliases")
    assert "alias 'qwen' collides with another model's name" in str(err)


def test_an_alias_claimed_by_two_models_is_refused_naming_both() -> None:
    err = build_refusal([model("a", aliases=["chat"]), model("b", aliases=["chat"])])
    assert (err.model, err.field) == ("b", "aliases")
    assert "alias 'chat' is claimed by both 'a' and 'b'" in str(err)


def test_a_fallback_that_resolves_to_nothing_is_refused() -> None:
    err = build_refusal([model("llama", fallbacks=["qwne"]), model("qwen")])
    assert (err.model, err.field) == ("llama", "fallbacks")
    assert "model 'llama': fallback 'qwne' is not in the catalog" in str(err)


@pytest.mark.parametrize("target", ["qwen", "qwen-latest"], ids=["by-name", "by-alias"])
@pytest.mark.parametrize("fallback_first", [True, False], ids=["before", "after"])
def test_a_fallback_resolves_by_name_or_alias_whatever_the_declaration_order(
    target: str, fallback_first: bool
) -> None:
    dependent = model("llama", fallbacks=[target])
    provider = model("qwen", aliases=["qwen-latest"])
    catalog = Catalog.build([dependent, provider] if fallback_first else [provider, dependent])
    assert catalog.fallbacks_of("llama") == ("qwen",)


def test_a_model_may_fall_back_to_itself() -> None:
    catalog = Catalog.build([model("llama", aliases=["l"], fallbacks=["l"])])
    assert catalog.fallbacks_of("llama") == ("llama",)


def test_build_applies_defaults_and_rules_to_definitions_it_is_given_raw() -> None:
    raw = Model.model_validate({"name": "llama", "source": "x", "profiles": [gpu_profile(tp=2)]})
    built = Catalog.build([raw]).resolve("llama")
    assert built is not None
    assert (built.profiles[0].engine, built.profiles[0].gpus_per_node) == ("vllm", 2)
    assert built.profiles[0].startup_timeout == timedelta(minutes=20)
    err = build_refusal([Model.model_validate({"name": "nosource", "profiles": [gpu_profile()]})])
    assert (err.model, err.field) == ("nosource", "source")


# -- lookups -----------------------------------------------------------------------------


@pytest.fixture
def catalog() -> Catalog:
    return Catalog.build(
        [
            model("zeta", aliases=["z", "last"]),
            model("alpha", fallbacks=["z"]),
            model("mid", aliases=["m"], fallbacks=["alpha", "mid"]),
        ]
    )


def test_resolve_finds_a_model_by_name_or_alias(catalog: Catalog) -> None:
    zeta = catalog.resolve("zeta")
    assert zeta is not None
    assert zeta.name == "zeta"
    assert catalog.resolve("z") == zeta
    assert catalog.resolve("last") == zeta


def test_resolve_of_an_unknown_name_is_none(catalog: Catalog) -> None:
    assert catalog.resolve("omega") is None
    assert "omega" not in catalog
    assert catalog.canonical("omega") is None


def test_resolve_is_exact(catalog: Catalog) -> None:
    assert catalog.resolve("Zeta") is None
    assert catalog.resolve("zeta ") is None


def test_models_keep_declaration_order(catalog: Catalog) -> None:
    assert [m.name for m in catalog.models()] == ["zeta", "alpha", "mid"]


def test_names_are_sorted(catalog: Catalog) -> None:
    assert catalog.names() == ["alpha", "mid", "zeta"]


def test_aliases_of_by_name_or_alias(catalog: Catalog) -> None:
    assert catalog.aliases_of("zeta") == ("z", "last")
    assert catalog.aliases_of("last") == ("z", "last")
    assert catalog.aliases_of("alpha") == ()
    assert catalog.aliases_of("omega") == ()


def test_fallbacks_are_given_as_canonical_names_in_written_order(catalog: Catalog) -> None:
    assert catalog.fallbacks_of("alpha") == ("zeta",)
    assert catalog.fallbacks_of("m") == ("alpha", "mid")
    assert catalog.fallbacks_of("omega") == ()


def test_declared_and_runtime_catalogs_are_told_apart() -> None:
    models = [model("llama", aliases=["l"])]
    declared = Catalog.build(models)
    assert declared.is_declared("llama")
    assert declared.is_declared("l")
    assert not declared.is_declared("other")
    assert not Catalog.build(models, declared=False).is_declared("llama")


# -- rendering ---------------------------------------------------------------------------


# -- views ---------------------------------------------------------------------------------


def test_placement_sees_each_profile_as_it_asks_for_hardware() -> None:
    m = model(
        "llama",
        profiles=[
            gpu_profile(
                "a100-2n",
                tp=4,
                pp=2,
                nodes=2,
                gpus_per_node=4,
                priority=5,
                node_selector={"zone": "eu"},
                min_memory_gb=64,
            ),
            cpu_profile("cpu", min_memory_gb=32),
        ],
    )
    gpu, cpu = m.placement_profiles()
    assert gpu == PlacementProfile(
        name="a100-2n",
        engine="vllm",
        gpu_class="A100",
        gpus_per_node=4,
        nodes=2,
        priority=5,
        node_selector={"zone": "eu"},
        min_memory_gb=64,
    )
    assert not gpu.cpu_only
    assert (cpu.gpu_class, cpu.gpus_per_node, cpu.nodes, cpu.min_memory_gb) == (None, 0, 1, 32)
    assert cpu.cpu_only


def test_the_engine_sees_the_profile_with_the_model_source_and_served_name() -> None:
    m = model(
        "llama",
        source="meta-llama/Llama-3-8B",
        profiles=[
            gpu_profile("a100", tp=2, args=["--max-model-len", "8192"], env={"HF_HOME": "/h"}),
            cpu_profile("cpu"),
        ],
    )
    engine = m.engine_profile("a100")
    assert engine is not None
    assert (engine.name, engine.engine, engine.gpu_class) == ("a100", "vllm", "A100")
    assert (engine.tp, engine.pp, engine.gpus_per_node, engine.nodes) == (2, 0, 2, 1)
    assert engine.args == ("--max-model-len", "8192")
    assert dict(engine.env) == {"HF_HOME": "/h"}
    assert (engine.model_path, engine.served_model_name) == ("meta-llama/Llama-3-8B", "llama")
    cpu = m.engine_profile("cpu")
    assert cpu is not None
    assert (cpu.engine, cpu.gpu_class, cpu.gpus_per_node) == ("llamacpp", None, 0)
    assert m.engine_profile("h100") is None


def test_views_are_copies_that_cannot_reach_back_into_the_catalog() -> None:
    m = model("llama", profiles=[gpu_profile(node_selector={"zone": "eu"}, env={"A": "1"})])
    placement = m.placement_profiles()[0]
    # A read-only Mapping by type; the test writes anyway, as a careless caller could.
    placement.node_selector["zone"] = "us"  # type: ignore[index]
    engine = m.engine_profile("a100")
    assert engine is not None
    engine.env["A"] = "2"  # type: ignore[index]  # likewise read-only by type
    assert m.profiles[0].node_selector == {"zone": "eu"}
    assert m.profiles[0].env == {"A": "1"}


def test_a_profile_is_found_by_its_name() -> None:
    m = model("llama", profiles=[gpu_profile("a100"), cpu_profile("cpu")])
    cpu = m.profile("cpu")
    assert cpu is not None
    assert cpu.engine == "llamacpp"
    assert m.profile("h100") is None
