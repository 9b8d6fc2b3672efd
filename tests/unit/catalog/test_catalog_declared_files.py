"""Loading model definitions from files: the declared catalog.yaml and runtime definition files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from catalog import CatalogError, load_declared, load_definitions, read_data

DECLARED = """\
models:
  - name: llama-70b
    aliases: [llama]
    source: meta-llama/Llama-3-70B
    scaling: {min: 1, max: 3}
    fallbacks: [qwen]
    profiles:
      - name: h100-tp8
        gpu_class: H100
        tp: 8
        startup_timeout: 45m
  - name: qwen
    source: Qwen/Qwen2-7B
    profiles:
      - name: cpu
        engine: llamacpp
"""

SINGLE = """\
name: experiment
source: org/experiment
profiles:
  - name: a100
    gpu_class: A100
"""


def write(tmp_path: Path, text: str, name: str = "catalog.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def declared_refusal(path: Path) -> CatalogError:
    with pytest.raises(CatalogError) as caught:
        load_declared(path)
    return caught.value


def definitions_refusal(path: Path) -> CatalogError:
    with pytest.raises(CatalogError) as caught:
        load_definitions(path)
    return caught.value


# -- the declared file -------------------------------------------------------------------


def test_a_declared_file_loads_every_model_in_order_as_declared(tmp_path: Path) -> None:
    catalog = load_declared(write(tmp_path, DECLARED))
    assert [m.name for m in catalog.models()] == ["llama-70b", "qwen"]
    assert catalog.declared_names == frozenset({"llama-70b", "qwen"})
    llama = catalog.resolve("llama")
    assert llama is not None
    assert llama.profiles[0].gpus_per_node == 8
    assert (llama.scaling.min, llama.scaling.max) == (1, 3)
    assert catalog.fallbacks_of("llama") == ("qwen",)


def test_a_declared_model_refusal_names_the_file_the_entry_and_the_model(tmp_path: Path) -> None:
    path = write(tmp_path, DECLARED.replace("        tp: 8\n", "        tp: 8\n        pp: 2\n"))
    err = declared_refusal(path)
    assert str(err).startswith(f"{path} models[0]: model 'llama-70b' profile 'h100-tp8': ")
    assert (err.model, err.profile, err.field) == ("llama-70b", "h100-tp8", "gpus_per_node")


def test_a_declared_type_error_names_the_file_and_the_entry(tmp_path: Path) -> None:
    path = write(
        tmp_path, DECLARED.replace("engine: llamacpp", "engine: llamacpp\n        tp: '2'")
    )
    err = declared_refusal(path)
    assert str(err).startswith(f"{path} models[1]: model 'qwen': profile 'cpu' (profiles[0].tp)")


def test_a_whole_catalog_refusal_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, DECLARED.replace("fallbacks: [qwen]", "fallbacks: [qwne]"))
    err = declared_refusal(path)
    assert str(err).startswith(f"{path}: model 'llama-70b': fallback 'qwne' is not in the catalog")
    assert (err.model, err.field) == ("llama-70b", "fallbacks")


def test_a_declared_file_must_hold_models_not_a_bare_model(tmp_path: Path) -> None:
    err = declared_refusal(write(tmp_path, SINGLE))
    assert "expected a mapping with `models: [...]`" in str(err)


def test_a_declared_file_must_not_be_a_bare_list(tmp_path: Path) -> None:
    err = declared_refusal(write(tmp_path, "- name: x\n"))
    assert "expected a mapping with `models: [...]`" in str(err)


def test_an_unknown_top_level_key_is_refused(tmp_path: Path) -> None:
    err = declared_refusal(write(tmp_path, DECLARED + "model_defaults: {}\n"))
    assert str(err).startswith(str(tmp_path / "catalog.yaml"))
    assert "unknown top-level key(s) 'model_defaults'" in str(err)


def test_models_must_be_a_list(tmp_path: Path) -> None:
    err = declared_refusal(write(tmp_path, "models:\n  name: x\n"))
    assert "`models` must be a list" in str(err)


@pytest.mark.parametrize("text", ["", "models:\n", "models: []\n"])
def test_an_empty_declared_file_declares_nothing(tmp_path: Path, text: str) -> None:
    assert len(load_declared(write(tmp_path, text))) == 0


def test_a_key_written_twice_is_refused_naming_the_key(tmp_path: Path) -> None:
    path = write(
        tmp_path, DECLARED.replace("gpu_class: H100", "gpu_class: H100\n        gpu_class: A100")
    )
    err = declared_refusal(path)
    assert str(err).startswith(f"{path}: ")
    assert "key 'gpu_class' is written twice" in str(err)


def test_invalid_yaml_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "models:\n  - name: [unclosed\n")
    err = declared_refusal(path)
    assert str(err).startswith(f"{path}: not valid YAML or JSON")
    # Where, by line and column; not PyYAML's name for a string it was handed.
    assert "<unicode string>" not in str(err) and "at line 2, column" in str(err), str(err)


def test_a_missing_declared_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    err = declared_refusal(path)
    assert str(err).startswith(f"{path}: cannot read the declared catalog")


# -- runtime definition files ------------------------------------------------------------


def test_a_runtime_file_may_hold_models(tmp_path: Path) -> None:
    models = load_definitions(write(tmp_path, DECLARED, "add.yaml"))
    assert [m.name for m in models] == ["llama-70b", "qwen"]


def test_a_runtime_file_may_hold_a_single_model(tmp_path: Path) -> None:
    (m,) = load_definitions(write(tmp_path, SINGLE, "add.yaml"))
    assert (m.name, m.profiles[0].gpu_class) == ("experiment", "A100")


def test_a_runtime_file_may_hold_a_list_of_models_and_refusals_name_the_item(
    tmp_path: Path,
) -> None:
    text = "- {name: a, source: x, profiles: [{name: p, gpu_class: A}]}\n- {name: b}\n"
    path = write(tmp_path, text, "add.yaml")
    err = definitions_refusal(path)
    assert str(err).startswith(f"{path} [1]: model 'b': source is required")
    good = write(tmp_path, text.splitlines()[0] + "\n", "good.yaml")
    assert [m.name for m in load_definitions(good)] == ["a"]


def test_a_runtime_json_file_is_read(tmp_path: Path) -> None:
    data = {"name": "j", "source": "x", "profiles": [{"name": "p", "gpu_class": "A"}]}
    (m,) = load_definitions(write(tmp_path, json.dumps(data), "add.json"))
    assert m.name == "j"


def test_a_single_model_runtime_file_refusal_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, SINGLE.replace("gpu_class", "gpu_clas"), "add.yaml")
    err = definitions_refusal(path)
    assert str(err).startswith(f"{path}: model 'experiment': profile 'a100'")
    assert "did you mean 'gpu_class'?" in str(err)


def test_a_runtime_file_with_no_models_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "models: []\n", "add.yaml")
    assert "holds no model definitions" in str(definitions_refusal(path))


def test_a_key_written_twice_in_json_is_refused_too(tmp_path: Path) -> None:
    path = write(tmp_path, '{"name": "a", "name": "b", "source": "x"}', "add.json")
    err = definitions_refusal(path)
    assert str(err).startswith(f"{path}: ")
    assert "key 'name' is written twice" in str(err)


# -- reading YAML or JSON ----------------------------------------------------------------


def test_flow_style_yaml_is_read_even_though_it_looks_like_json() -> None:
    assert read_data("{name: x, profiles: [{name: p}]}", "f.yaml") == {
        "name": "x",
        "profiles": [{"name": "p"}],
    }


def test_broken_json_is_refused_with_the_json_parser_complaint() -> None:
    with pytest.raises(CatalogError, match=r"^f\.json: not valid YAML or JSON: Expecting"):
        read_data('{"name": "x",,}', "f.json")


def test_an_unhashable_yaml_key_is_refused_not_a_crash() -> None:
    with pytest.raises(CatalogError, match="found unhashable key"):
        read_data("? [a, b]\n: 1\n", "f.yaml")
