"""A model's disruption budget (``disruption:``): optional, strict, a count or a percentage."""

from __future__ import annotations

import json

import pytest

from catalog import parse_model
from catalog.stored.fast_decode import decode_definition
from tests.unit.catalog.catalog_builders import definition, refusal, where


def test_no_disruption_field_means_movable_with_no_cap_and_is_not_stored() -> None:
    model = parse_model(definition("llama"))
    assert (model.disruption.max_unavailable, model.disruption.movable) == (None, True)
    assert model.disruption.repair_spread is False
    # Left out while default: a definition that says nothing hashes as it did before.
    assert "disruption" not in model.to_definition()


@pytest.mark.parametrize(
    "budget",
    [
        {"max_unavailable": 2},
        {"max_unavailable": "25%"},
        {"max_unavailable": "100%", "repair_spread": True},
        {"movable": False},
    ],
)
def test_a_disruption_budget_is_kept_stored_and_read_back(budget: dict[str, object]) -> None:
    model = parse_model(definition("llama", disruption=budget))
    stored = model.to_definition()
    assert {k: v for k, v in stored["disruption"].items() if k in budget} == budget
    assert parse_model(stored) == model


@pytest.mark.parametrize(
    "value",
    # Fullwidth digits pass str.isdigit(); a float, a bool and a sign are not counts.
    ["101%", "%", "5", "five%", "-5%", "1e3%", "\uff15\uff10%", "10 %", "0010%", 1.5, True, -1],
)
def test_a_malformed_max_unavailable_is_refused_naming_model_and_field(value: object) -> None:
    err = refusal(definition("llama", disruption={"max_unavailable": value}))
    assert "disruption.max_unavailable" in str(err)
    assert "llama" in str(err)


def test_a_count_beyond_the_replica_bound_is_refused_with_what_to_do() -> None:
    err = refusal(definition("llama", disruption={"max_unavailable": 10**9}))
    assert where(err) == ("llama", None, "disruption.max_unavailable")
    assert "movable: false" in str(err)


def test_a_huge_percentage_text_is_refused_and_shown_bounded() -> None:
    err = refusal(definition("llama", disruption={"max_unavailable": "9" * 10_000 + "%"}))
    assert len(str(err)) < 400


def test_a_typo_in_disruption_is_refused_with_a_suggestion() -> None:
    err = refusal(definition("llama", disruption={"moveable": False}))
    assert "did you mean 'movable'?" in str(err)


def test_the_fast_decoder_reads_the_budget_as_the_full_parser_does() -> None:
    model = parse_model(definition("llama", disruption={"max_unavailable": "10%"}))
    payload = json.dumps({"model": model.to_definition()})
    fast = decode_definition(payload)
    assert fast == model
    assert fast is not None and fast.disruption.max_unavailable == "10%"
