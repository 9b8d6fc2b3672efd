"""The identifier grammar (catalog.definition.identifiers): one rule per kind of name, every path.

Pure: definitions, the declared file, node reports and a command's actor, reason
and key are judged here without a database; the stores are in tests/e2e.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from catalog import Catalog, CatalogError, CatalogState, load_declared, parse_model
from catalog.definition.identifiers import IdentifierError, check_command
from events.core.types import StoredEvent
from events.read.replay import replay
from scheduler.planner.fleet.inventory import NodeReportError, parse_node_report
from tests.support import definition, model


def refusal(raw: dict[str, Any], origin: str = "") -> CatalogError:
    with pytest.raises(CatalogError) as caught:
        parse_model(raw, origin=origin)
    return caught.value


# -- model names and aliases ----------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "llama-70b",
        "meta-llama/Llama-3.1-70B-Instruct",  # a HuggingFace id
        "llama3.1:70b",  # an Ollama-style tag
        "ft:gpt-4o-mini:org::abc123",  # an OpenAI fine-tune id
        "Qwen2.5_7B",
        "x",
        "a" * 200,
    ],
)
def test_a_model_name_as_real_ids_are_written_is_accepted(name: str) -> None:
    assert parse_model(definition(name)).name == name


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("a" * 201, "201 characters long; at most 200 are allowed"),
        ("x" * 300, "300 characters long"),
        ("x\ny", "U+000A (a control character)"),
        ("x\x1b[31my", "U+001B"),
        ("abc\u202edef", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
        ("llama\u200b-70b", "U+200B (ZERO WIDTH SPACE)"),
        ("llama\u00a070b", "U+00A0 (NO-BREAK SPACE)"),
        ("ll\u0430ma-3.1-70b", "U+0430 (CYRILLIC SMALL LETTER A), which is not ASCII"),
        ("llama 70b", "is not ASCII letters, digits and . _ - : /"),
        ("-llama", "starting and ending with a letter or digit"),
        ("llama/", "starting and ending with a letter or digit"),
        ("a#b", "is not ASCII letters"),
    ],
)
def test_a_model_name_outside_the_grammar_is_refused_naming_the_field(name: str, says: str) -> None:
    err = refusal(definition(name))
    assert err.field == "name"
    assert says in str(err)
    # The value is shown escaped and bounded, never raw.
    assert str(err).isprintable() and len(str(err)) < 500


def test_an_alias_a_fallback_and_a_profile_name_follow_their_grammars() -> None:
    err = refusal(definition("llama", aliases=["ll\u0430ma"]))
    assert (err.model, err.field) == ("llama", "aliases")
    err = refusal(definition("llama", fallbacks=["x\ny"]))
    assert (err.model, err.field) == ("llama", "fallbacks")
    raw = definition("llama")
    raw["profiles"][0]["name"] = "a100/tp4"  # no '/' in a profile name
    err = refusal(raw)
    assert (err.model, err.profile, err.field) == ("llama", "a100/tp4", "profiles.name")
    raw = definition("llama", gpu_class="A" * 65)  # the placements column holds 64
    err = refusal(raw)
    assert (err.profile, err.field) == ("main", "gpu_class")
    raw = definition("llama")
    raw["profiles"][0]["node_selector"] = {"zone": "eu\nwest"}
    assert refusal(raw).field == "node_selector"
    assert refusal(definition("llama", source="org/m\u202e")).field == "source"


def test_a_declared_file_with_a_bad_name_is_refused_naming_the_file_and_the_entry(
    tmp_path: Path,
) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"models": [definition("ok"), definition("x" * 300)]}))
    with pytest.raises(CatalogError) as caught:
        load_declared(path)
    assert str(caught.value).startswith(f"{path} models[1]: a model: name 'xxx")
    assert caught.value.field == "name"


# -- unique regardless of case --------------------------------------------------------


def test_a_name_differing_only_in_case_from_an_alias_is_a_collision_in_the_declared_file() -> None:
    with pytest.raises(CatalogError) as caught:
        Catalog.build([model("llama-3", aliases=["llama-70b"]), model("LLAMA-70B")])
    assert "only in case" in str(caught.value)
    assert (caught.value.model, caught.value.field) == ("llama-3", "aliases")
    with pytest.raises(CatalogError, match="only in case"):
        Catalog.build([model("llama-70b"), model("other", aliases=["Llama-70B"])])


def test_a_runtime_add_differing_only_in_case_from_a_declared_alias_is_refused() -> None:
    declared = Catalog.build([model("llama-3", aliases=["llama-70b"])])
    state = CatalogState(declared, config_path="catalog.yaml")
    with pytest.raises(CatalogError) as caught:
        state.check_add([model("LLAMA-70B")])
    message = str(caught.value)
    assert "as 'llama-70b', differing only in case" in message
    assert "declared model 'llama-3' in catalog.yaml" in message
    with pytest.raises(CatalogError, match="regardless of case"):
        state.check_add([model("a", aliases=["Dup"]), model("b", aliases=["dUP"])])


def test_aliases_and_profiles_of_one_model_are_unique_regardless_of_case() -> None:
    assert refusal(definition("llama", aliases=["LLAMA"])).field == "aliases"
    assert refusal(definition("llama", aliases=["big", "BIG"])).field == "aliases"
    raw = definition("llama")
    raw["profiles"].append({**raw["profiles"][0], "name": "MAIN"})
    assert refusal(raw).field == "profiles.name"


def test_a_removed_name_can_be_taken_again_in_another_case() -> None:
    state = CatalogState(Catalog.build([]))
    state.add(model("llama"))
    state.check_remove("llama")
    state.remove("llama")
    (added,) = state.check_add([model("LLAMA")])
    state.add(added)
    assert state.resolve("LLAMA") is not None and state.resolve("llama") is None


# -- replay: rows written before the rule ---------------------------------------------


def _added(position: int, raw: dict[str, Any]) -> StoredEvent:
    return StoredEvent(
        position,
        f"e{position}",
        f"c{position}",
        "model.added",
        1,
        str(raw["name"])[:255],
        json.dumps({"model": raw}),
        "old-release",
        "",
        datetime(2026, 1, 1, tzinfo=UTC),
    )


def test_replay_skips_and_names_a_stored_add_whose_name_breaks_the_grammar() -> None:
    events = [
        _added(1, definition("x\ny")),
        _added(2, definition("y" * 300)),
        _added(3, definition("ok")),
    ]
    result = replay(Catalog.build([]), events)
    assert result.catalog.names() == ["ok"]
    assert [s.position for s in result.skipped] == [1, 2]
    assert "U+000A" in result.skipped[0].reason
    assert "300 characters long" in result.skipped[1].reason


def test_replay_skips_a_stored_add_that_differs_only_in_case_and_keeps_the_first() -> None:
    # An older release accepted both; the first keeps the name, the second is
    # skipped with the reason, as for any other collision.
    declared = Catalog.build([model("llama-70b")])
    result = replay(declared, [_added(1, definition("LLAMA-70B")), _added(2, definition("Qw"))])
    assert result.catalog.names() == ["Qw", "llama-70b"]
    (skipped,) = result.skipped
    assert skipped.position == 1 and "differing only in case" in skipped.reason


# -- node reports -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("report", "field"),
    [
        ({"name": "n" * 254}, "name"),
        ({"name": "gpu\n7"}, "name"),
        ({"name": "gpu-7", "gpu_class": "A" * 65, "gpus": 1}, "gpu_class"),
        ({"name": "gpu-7", "fabric": "ib\u202e"}, "fabric"),
        ({"name": "gpu-7", "labels": {"zone\n": "eu"}}, "labels"),
        ({"name": "gpu-7", "labels": {"zone": "x" * 129}}, "labels"),
    ],
)
def test_a_node_report_with_a_name_outside_its_grammar_is_refused(
    report: dict[str, Any], field: str
) -> None:
    with pytest.raises(NodeReportError) as caught:
        parse_node_report(report)
    (problem,) = caught.value.problems
    assert f": {field} " in problem
    assert problem.isprintable()


def test_a_node_named_as_a_host_is_accepted() -> None:
    report = parse_node_report(
        {"name": "node01.dc1", "labels": {"nvidia.com/gpu.product": "A100-SXM4-80GB", "x": ""}}
    )
    assert report.name == "node01.dc1"


# -- what a command records beside its events -------------------------------------------


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"actor": "alice\nbob"}, "actor"),
        ({"actor": " alice"}, "actor"),
        ({"actor": "a" * 129}, "actor"),
        ({"reason": "r" * 2001}, "reason"),
        ({"reason": "fine\u202e"}, "reason"),
        ({"key": "k" * 250}, "key"),
        ({"key": "k#2"}, "key"),  # the log names a keyed list's second event KEY#2
        ({"key": "has space"}, "key"),
        ({"key": ""}, "key"),
    ],
)
def test_an_actor_reason_or_key_outside_the_grammar_is_refused(
    values: dict[str, Any], field: str
) -> None:
    args: dict[str, Any] = {"actor": "alice", "reason": "", "key": None, **values}
    with pytest.raises(IdentifierError) as caught:
        check_command(**args)
    assert caught.value.field == field


def test_people_and_reasons_may_be_written_in_any_script() -> None:
    check_command(actor="Zoë Ðорогова", reason="проверка: ok ✓", key="550e8400-e29b-41d4")


def test_explained_replay_shows_what_a_case_twin_collides_with() -> None:
    from events.read.replay_reasons import explain, render_context

    declared = Catalog.build([model("llama-3", aliases=["llama-70b"])])
    _, steps = explain(declared, [_added(1, definition("LLAMA-70B"))])
    (step,) = list(steps)
    assert not step.applied
    assert render_context(step.context)[0] == (
        "collides with: llama-70b, an alias of declared model llama-3"
    )
