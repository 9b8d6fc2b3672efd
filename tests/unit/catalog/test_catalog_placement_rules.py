"""The optional ``placement:`` of a model: priority, spread_by, spread_required."""

from __future__ import annotations

import pytest

from catalog import CatalogError
from catalog.definition.parse import parse_model
from tests.support import definition, model


def test_a_model_without_placement_records_exactly_as_before() -> None:
    assert "placement" not in model("m").to_definition()


def test_placement_rules_are_read_normalised_and_recorded() -> None:
    m = model("m", placement={"priority": 10, "spread_by": " zone ", "spread_required": True})

    assert (m.placement.priority, m.placement.spread_by, m.placement.spread_required) == (
        10,
        "zone",
        True,
    )
    assert m.to_definition()["placement"] == {
        "priority": 10,
        "spread_by": "zone",
        "spread_required": True,
    }
    assert parse_model(m.to_definition()) == m


def test_an_empty_spread_label_means_none() -> None:
    assert model("m", placement={"spread_by": ""}).placement.spread_by is None


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        ({"priorty": 1}, "placement.priorty: unknown field; did you mean 'priority'?"),
        (
            {"priority": "5"},
            "placement.priority: Input should be a valid integer (got '5'); write a whole "
            "number, unquoted, e.g. `priority: 2`",
        ),
        ({"priority": 10**10}, "placement.priority 10000000000 is beyond"),
        ({"spread_by": "my zone"}, "placement.spread_by 'my zone' is not a label key"),
        (
            {"spread_required": "yes"},
            "placement.spread_required: Input should be a valid boolean (got 'yes'); write "
            "true or false, unquoted",
        ),
    ],
)
def test_a_bad_placement_is_refused_naming_model_and_field(
    placement: dict[str, object], message: str
) -> None:
    with pytest.raises(CatalogError) as refused:
        parse_model(definition("m", placement=placement))

    assert f"model 'm': {message}" in str(refused.value)
