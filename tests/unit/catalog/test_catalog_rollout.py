"""A model's rollout bounds: optional, strict, and never both zero."""

from __future__ import annotations

import pytest

from catalog import parse_model
from tests.unit.catalog.catalog_builders import definition, refusal, where


def test_rollout_defaults_to_one_surge_replica_and_none_missing() -> None:
    rollout = parse_model(definition("llama")).rollout
    assert (rollout.max_surge, rollout.max_unavailable) == (1, 0)


def test_an_explicit_rollout_is_kept_and_stored_with_the_definition() -> None:
    model = parse_model(definition("llama", rollout={"max_surge": 0, "max_unavailable": 1}))
    assert model.to_definition()["rollout"] == {"max_surge": 0, "max_unavailable": 1}
    assert parse_model(model.to_definition()) == model


def test_a_rollout_with_neither_a_surge_nor_a_missing_replica_is_refused() -> None:
    err = refusal(definition("llama", rollout={"max_surge": 0, "max_unavailable": 0}))
    assert where(err) == ("llama", None, "rollout")
    assert "could never start" in str(err)


@pytest.mark.parametrize("field", ["max_surge", "max_unavailable"])
def test_a_negative_rollout_bound_is_refused(field: str) -> None:
    err = refusal(definition("llama", rollout={field: -1}))
    assert where(err) == ("llama", None, f"rollout.{field}")


@pytest.mark.parametrize("value", ["1", 1.0, True])
def test_a_rollout_bound_must_be_an_integer(value: object) -> None:
    assert "rollout.max_surge" in str(refusal(definition("llama", rollout={"max_surge": value})))


def test_a_typo_in_rollout_is_refused_with_a_suggestion() -> None:
    err = refusal(definition("llama", rollout={"max_surg": 2}))
    assert "did you mean 'max_surge'?" in str(err)
