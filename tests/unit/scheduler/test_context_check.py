"""The catalog's context_length held to what one request may use on a replica."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler.lifecycle.context_check import context_warning


def test_the_seed_arithmetic_is_named_with_both_numbers_and_what_to_change() -> None:
    warning = context_warning(
        model="chat",
        profile="cpu",
        engine="llamacpp",
        context_length=4096,
        effective=2048,
        detail="--ctx-size 8192 / --parallel 4 = 2048",
    )
    assert warning is not None
    assert warning.startswith("--ctx-size 8192 / --parallel 4 = 2048 < context_length 4096: ")
    assert "model 'chat', profile 'cpu'" in warning
    assert "raise --ctx-size or lower --parallel" in warning
    assert warning.endswith("lower the model's context_length to 2048")


def test_vllm_is_told_about_max_model_len() -> None:
    warning = context_warning(
        model="big",
        profile="a100",
        engine="vllm",
        context_length=32768,
        effective=8192,
        detail="max_model_len 8192",
    )
    assert warning is not None
    assert warning.startswith("max_model_len 8192 < context_length 32768: ")
    assert "raise --max-model-len" in warning


@given(
    context_length=st.integers(min_value=0, max_value=1 << 30),
    effective=st.one_of(st.none(), st.integers(min_value=1, max_value=1 << 30)),
    engine=st.sampled_from(["llamacpp", "vllm", "sim", "other"]),
)
def test_a_warning_exactly_when_the_catalog_promises_more_than_the_engine_gives(
    context_length: int, effective: int | None, engine: str
) -> None:
    warning = context_warning(
        model="m",
        profile="p",
        engine=engine,
        context_length=context_length,
        effective=effective,
        detail="",
    )
    promised_more = context_length > 0 and effective is not None and effective < context_length
    assert (warning is not None) == promised_more
    if warning is not None:
        assert f"< context_length {context_length}" in warning
        assert f"{effective} tokens" in warning
