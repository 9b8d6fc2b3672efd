"""From raw YAML/JSON data to a model: strict types, unknown fields, durations, and messages."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from catalog import parse_model
from catalog.forms.durations import format_duration, parse_duration
from tests.unit.catalog.catalog_builders import definition, gpu_profile, refusal, where

# -- unknown fields ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field", "profile", "hint"),
    [
        (definition("llama", fallback=["x"]), "fallback", None, "fallbacks"),
        (
            definition("llama", profiles=[gpu_profile("p", gpu_clas="A")]),
            "profiles[0].gpu_clas",
            "p",
            "gpu_class",
        ),
        (definition("llama", scaling={"mx": 2}), "scaling.mx", None, "max"),
        (definition("llama", slo={"ttft_p9": "1s"}), "slo.ttft_p9", None, "ttft_p99"),
        (definition("llama", capabilities={"tool": True}), "capabilities.tool", None, "tools"),
    ],
    ids=["model", "profile", "scaling", "slo", "capabilities"],
)
def test_an_unknown_field_is_refused_at_every_level_with_a_did_you_mean_hint(
    raw: dict[str, Any], field: str, profile: str | None, hint: str
) -> None:
    err = refusal(raw)
    assert where(err) == ("llama", profile, field)
    assert "unknown field" in str(err)
    assert f"did you mean {hint!r}?" in str(err)


def test_an_unknown_field_in_a_profile_names_the_profile_in_the_message() -> None:
    err = refusal(definition("llama", profiles=[gpu_profile("a100"), gpu_profile("h100", tpp=2)]))
    assert "model 'llama': profile 'h100' (profiles[1].tpp)" in str(err)
    assert "did you mean 'tp'?" in str(err)


def test_an_unknown_field_with_no_close_match_lists_the_known_ones_without_guessing() -> None:
    err = refusal(definition("llama", scaling={"zzz": 1}))
    assert "did you mean" not in str(err)
    assert "known: max, min" in str(err)


def test_every_problem_of_a_definition_is_reported_at_once() -> None:
    err = refusal(definition("llama", colour="red", profiles=[gpu_profile("p", tp="2")]))
    assert "colour: unknown field" in str(err)
    assert "profiles[0].tp" in str(err)


# -- strict types ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile_fields", "field"),
    [
        ({"tp": "4"}, "profiles[0].tp"),
        ({"tp": True}, "profiles[0].tp"),
        ({"nodes": 1.0}, "profiles[0].nodes"),
        ({"weight": True}, "profiles[0].weight"),
        ({"weight": "2"}, "profiles[0].weight"),
        ({"gpu_class": 100}, "profiles[0].gpu_class"),
        ({"env": {"HF_HOME": 1}}, "profiles[0].env.HF_HOME"),
        ({"args": ["--max-model-len", 4096]}, "profiles[0].args[1]"),
        ({"node_selector": {"zone": None}}, "profiles[0].node_selector.zone"),
    ],
    ids=["str-for-int", "bool-for-int", "float-for-int", "bool-for-float", "str-for-float",
         "int-for-str", "env-value", "args-item", "selector-value"],
)  # fmt: skip
def test_a_value_of_the_wrong_type_is_refused_not_coerced(
    profile_fields: dict[str, Any], field: str
) -> None:
    err = refusal(definition("llama", profiles=[gpu_profile("p", **profile_fields)]))
    assert where(err) == ("llama", "p", field)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"aliases": "llama-latest"}, "aliases"),
        ({"aliases": [3]}, "aliases[0]"),
        ({"profiles": {"name": "p", "gpu_class": "A100"}}, "profiles"),
        ({"profiles": ["p"]}, "profiles[0]"),
        ({"scaling": {"min": "1"}}, "scaling.min"),
        ({"capabilities": {"tools": "yes"}}, "capabilities.tools"),
        ({"context_length": 4096.0}, "context_length"),
        ({"source": None}, "source"),
    ],
)
def test_a_model_level_value_of_the_wrong_type_is_refused(
    fields: dict[str, Any], field: str
) -> None:
    err = refusal(definition("llama", **fields))
    assert where(err) == ("llama", None, field)


_TEXT = "; write text, quoted if YAML would read it as something else"


@pytest.mark.parametrize(
    ("profile_fields", "advice"),
    [
        ({"tp": "two"}, "; write a whole number, unquoted, e.g. `tp: 2`"),
        ({"weight": "2"}, "; write a number, unquoted, e.g. `weight: 1.5`"),
        ({"gpu_class": 100}, _TEXT + ', e.g. `gpu_class: "8"`'),
        # A key the definition chose is not written into an example (nor an item of a list).
        ({"env": {"MY-VAR": 1}}, _TEXT),
        ({"args": ["--max-model-len", 4096]}, _TEXT),
    ],
    ids=["int", "float", "str", "env-key", "args-item"],
)  # fmt: skip
def test_a_value_of_the_wrong_type_says_how_to_write_it(
    profile_fields: dict[str, Any], advice: str
) -> None:
    err = refusal(definition("llama", profiles=[gpu_profile("p", **profile_fields)]))
    assert str(err).endswith(advice), str(err)


def test_a_name_of_the_wrong_type_is_refused_as_a_model_with_no_name() -> None:
    err = refusal(definition(3))  # type: ignore[arg-type]  # the wrong type is the point
    assert err.field == "name"
    assert "a model with no name" in str(err)


def test_a_key_that_is_not_a_string_is_refused() -> None:
    raw: dict[Any, Any] = {**definition("llama"), 1: "x"}
    err = refusal(raw)
    assert err.model == "llama"
    assert "Keys should be strings" in str(err)


@pytest.mark.parametrize("raw", [["name", "llama"], "llama", None, 3])
def test_a_definition_that_is_not_a_mapping_is_refused(raw: object) -> None:
    err = refusal(raw)
    assert "must be a mapping of fields" in str(err)


def test_a_model_handed_out_cannot_be_edited_in_place() -> None:
    m = parse_model(definition())
    with pytest.raises(ValueError, match="frozen"):
        m.name = "other"
    with pytest.raises(ValueError, match="frozen"):
        m.profiles[0].tp = 8


# -- origin ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [definition("llama", colour="red"), definition("llama", scaling={"min": 2, "max": 1})],
    ids=["type-error", "rule-error"],
)
def test_a_refusal_starts_with_where_the_definition_came_from(raw: dict[str, Any]) -> None:
    err = refusal(raw, origin="conf/catalog.yaml models[3]")
    assert str(err).startswith("conf/catalog.yaml models[3]: model 'llama'")
    assert err.model == "llama"


# -- durations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("20m", timedelta(minutes=20)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1h0m5s", timedelta(hours=1, seconds=5)),
        ("1.5h", timedelta(minutes=90)),
        ("250ms", timedelta(milliseconds=250)),
        ("750us", timedelta(microseconds=750)),
        (" 45s ", timedelta(seconds=45)),
        ("45", timedelta(seconds=45)),
        (90, timedelta(seconds=90)),
        (1.5, timedelta(seconds=1.5)),
    ],
)
def test_durations_are_accepted_as_go_strings_or_seconds(
    written: object, expected: timedelta
) -> None:
    m = parse_model(
        definition(
            profiles=[gpu_profile(startup_timeout=written)],
            slo={"ttft_p99": written, "tpot_p99": written},
        )
    )
    assert m.profiles[0].startup_timeout == expected
    assert m.slo.ttft_p99 == expected
    assert m.slo.tpot_p99 == expected


@pytest.mark.parametrize(
    "written",
    ["20 minutes", "1h30", "-5s", "1d", "", "m", "abc", True, -5, None, [90], float("nan")],
)
def test_a_duration_in_any_other_form_is_refused(written: object) -> None:
    err = refusal(definition("llama", profiles=[gpu_profile("p", startup_timeout=written)]))
    assert where(err) == ("llama", "p", "profiles[0].startup_timeout")


@pytest.mark.parametrize("written", [float("inf"), 10**20, "99999999999999h"])
def test_a_duration_too_large_to_hold_is_refused_rather_than_crashing(written: object) -> None:
    err = refusal(definition("llama", slo={"ttft_p99": written}))
    assert where(err) == ("llama", None, "slo.ttft_p99")
    assert "too large" in str(err)


def test_an_invalid_duration_message_shows_the_accepted_forms() -> None:
    err = refusal(definition("llama", slo={"tpot_p99": "fast"}))
    assert "write e.g. 90s, 20m, 1h30m or seconds" in str(err)


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (timedelta(0), "0s"),
        (timedelta(minutes=20), "20m"),
        (timedelta(hours=1, minutes=30), "1h30m"),
        (timedelta(hours=26, seconds=1), "26h1s"),
        (timedelta(seconds=1, milliseconds=5), "1s5ms"),
        (timedelta(microseconds=400), "400us"),
    ],
)
def test_a_duration_is_written_in_the_shortest_form_that_reads_back_exactly(
    value: timedelta, written: str
) -> None:
    assert format_duration(value) == written
    assert parse_duration(written) == value


def test_a_sub_millisecond_duration_survives_a_stored_definition() -> None:
    # A stored definition is to_definition() as JSON; a timeout that came back as
    # "0s" would silently become the 20-minute default on replay.
    m = parse_model(definition(profiles=[gpu_profile(startup_timeout=0.0004)]))
    stored = m.to_definition()
    assert stored["profiles"][0]["startup_timeout"] == "400us"
    assert parse_model(stored) == m
