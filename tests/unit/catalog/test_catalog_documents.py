"""Every parsed document is bounded: no anchors or aliases, and limits on bytes, depth, values."""

from __future__ import annotations

from pathlib import Path

import pytest

from catalog import CatalogError, load_declared, load_definitions
from catalog.reading.documents import (
    BODY_LIMITS,
    DocumentRefused,
    Limits,
    NotJSON,
    read_data,
    read_file,
    read_json,
)
from tests.hostile.documents import deep_definition, deep_json_array, model_bomb


def test_the_alias_bomb_is_refused_at_its_first_anchor_naming_the_rule() -> None:
    bomb = model_bomb()
    assert len(bomb) < 450

    with pytest.raises(DocumentRefused) as refused:
        read_data(bomb, "bomb.yaml")

    assert refused.value.limit == "aliases"
    assert str(refused.value).startswith("bomb.yaml: line 5: YAML anchors and aliases")
    assert "write each value out" in str(refused.value)


@pytest.mark.parametrize(
    "text",
    [
        "name: &n x\nsource: org/x\n",  # an anchor alone, never used
        "a: [1]\nb: *a\n",  # an alias of nothing is a YAML error anyway
        "base: &b {tp: 1}\nmodel: {<<: *b}\n",  # merge keys need aliases
    ],
)
def test_any_anchor_or_alias_is_refused(text: str) -> None:
    with pytest.raises(CatalogError, match=r"anchors and aliases|not valid YAML"):
        read_data(text, "f.yaml")


@pytest.mark.parametrize(
    "text",
    [deep_json_array(3000), deep_definition(3000), "[" * 3000, "x:\n" + "- " * 3000 + "1\n"],
    ids=["json-array", "json-field", "unclosed", "yaml-block"],
)
def test_a_document_nested_3000_deep_is_refused_by_its_depth_not_a_recursion_error(
    text: str,
) -> None:
    with pytest.raises(DocumentRefused) as refused:
        read_data(text, "request body")

    assert refused.value.limit == "depth"
    assert "nested deeper than 32 levels" in str(refused.value)


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    text = '{"name": "x", "note": "' + "[" * 100 + '\\" ]]]"}'

    assert read_data(text, "f.json") == {"name": "x", "note": "[" * 100 + '" ]]]'}


def test_size_and_value_count_are_bounded_and_named() -> None:
    small = Limits(max_bytes=100, max_depth=32, max_nodes=10)

    with pytest.raises(DocumentRefused, match="larger than 100 bytes") as too_big:
        read_data("x" * 101, "f", small)
    assert too_big.value.limit == "bytes"
    for text in ("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]", "- 1\n" * 10):
        with pytest.raises(DocumentRefused, match="more than 10 values") as too_many:
            read_data(text, "f", small)
        assert too_many.value.limit == "nodes"


def test_a_file_is_read_no_further_than_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_bytes(b"# " + b"x" * (BODY_LIMITS.max_bytes + 10))

    with pytest.raises(DocumentRefused, match="larger than 1048576 bytes"):
        read_file(path, "definition file", BODY_LIMITS)


def test_every_file_path_refuses_the_bomb(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(model_bomb())

    for load in (load_declared, load_definitions):
        with pytest.raises(DocumentRefused, match=f"{path}: line 5: YAML anchors"):
            load(path)


def test_real_definitions_are_within_the_limits() -> None:
    text = (
        "models:\n"
        "  - name: m\n    source: org/m\n"
        "    profiles:\n      - name: p\n        gpu_class: T4\n"
        "        node_selector: {zone: a}\n"
    )

    assert read_data(text, "catalog.yaml", BODY_LIMITS)["models"][0]["profiles"][0][
        "node_selector"
    ] == {"zone": "a"}


@pytest.mark.parametrize(
    "text",
    [
        '{"env": {"A": "\\ud800"}}',  # a lone high surrogate, JSON-escaped
        '{"\\udc00": 1}',  # in a key
        '["ok", ["\\udfff"]]',  # nested in a list
    ],
)
def test_a_lone_surrogate_is_refused_naming_the_document(text: str) -> None:
    """Half of a UTF-16 pair, spelled as a JSON escape, decodes to a string no UTF-8
    encoder takes: accepted, it broke every later answer that printed the model (hypothesis
    seed 13 found it through a stored payload). The reader refuses it, for bodies, files
    and stored rows alike; a whole pair is a character and passes."""
    with pytest.raises(CatalogError, match=r"body: .*lone surrogate"):
        read_json(text, "body", Limits())
    with pytest.raises(CatalogError, match="lone surrogate"):
        read_data(text, "body", Limits())
    assert read_json('{"a": "\\ud83d\\ude00"}', "body", Limits()) == {"a": "\U0001f600"}


@pytest.mark.parametrize(
    "text",
    [
        '{"gpus": 4, "labels": {"zone": "a"}}',
        '[{"a": "[[[{{{"}]',
        '{"deep": ' + "[" * 33 + "]" * 33 + "}",  # over the depth: refused the same way
        '{"a": 1, "a": 2}',  # a key written twice: refused the same way
    ],
)
def test_json_only_reads_json_exactly_as_read_data_does(text: str) -> None:
    def outcome(**json_only: bool) -> object:
        try:
            return read_data(text, "body", BODY_LIMITS, **json_only)
        except CatalogError as exc:
            return str(exc)

    assert outcome(json_only=True) == outcome()


@pytest.mark.parametrize("text", ["gpus: 4\n", "{gpus: 4}", "- a\n", "gpus: &x 4\n"])
def test_json_only_hands_back_yaml_without_parsing_it(text: str) -> None:
    with pytest.raises(NotJSON):
        read_data(text, "body", BODY_LIMITS, json_only=True)
