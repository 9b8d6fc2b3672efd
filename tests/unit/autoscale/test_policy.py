"""[autoscale] in llmgw.toml: defaults that work, refusals that name the key."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscale.policy import DEFAULT_POLICY, PolicyError, parse_policy


def test_an_empty_table_is_the_documented_defaults() -> None:
    p = parse_policy({})
    assert p == DEFAULT_POLICY
    assert p.interval == timedelta(seconds=15) and p.window == timedelta(seconds=60)
    assert p.defaults.target == 0.7 and p.defaults.up_step == 4 and p.defaults.down_step == 1


def test_a_model_opts_out_or_overrides_its_own_keys_only() -> None:
    p = parse_policy({"target": 0.6, "models": {"big": {"enabled": False}, "hot": {"target": 0.4}}})
    assert not p.for_model("big").enabled
    assert p.for_model("hot").target == 0.4 and p.for_model("hot").enabled
    assert p.for_model("other").target == 0.6
    assert not parse_policy({"enabled": False}).for_model("other").enabled


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ({"taget": 0.5}, "unknown key(s) 'taget'"),
        ({"target": 1.5}, "target: 1.5 must be a share of capacity"),
        ({"target": True}, "is not a number"),
        ({"up_step": 0}, "up_step: 0 must be a whole number of replicas"),
        ({"interval": "soon"}, "interval"),
        ({"window": "5s", "interval": "15s"}, "shorter than interval"),
        ({"models": {"m": {"interval": "5s"}}}, "a model's table may set"),
        ({"models": {"m": 3}}, 'models."m"] must be a table'),
        ({"default_capacity": float("inf")}, "default_capacity"),
    ],
)
def test_a_bad_value_is_refused_naming_the_key_and_the_fix(
    table: dict[str, Any], words: str
) -> None:
    with pytest.raises(PolicyError) as refused:
        parse_policy(table, "llmgw.toml: [autoscale]")
    assert words in str(refused.value)
    assert "llmgw.toml: [autoscale" in str(refused.value)


@given(
    st.dictionaries(
        st.sampled_from(["target", "up_step", "down_step", "up_cooldown", "interval", "x"]),
        st.one_of(st.integers(-5, 50), st.floats(allow_nan=True), st.text(max_size=5)),
        max_size=4,
    )
)
def test_any_table_is_either_refused_or_a_policy_whose_digest_is_stable(
    table: dict[str, Any],
) -> None:
    try:
        p = parse_policy(table)
    except PolicyError:
        return
    assert 0 < p.defaults.target <= 1 and p.defaults.up_step >= 1
    assert parse_policy(p.to_json()) == p
    assert parse_policy(p.to_json()).digest() == p.digest()
