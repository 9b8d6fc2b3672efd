"""The gateway admits by the smaller of the catalog's context_length and what the model's
ready replicas really give one request (their engines' effective_context_length)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.definition.parse import parse_model
from gateway.stages import admission
from gateway.stages.admission import Refusal
from gateway.table import MAX_CONTEXT_DETAIL, Table, build

ARITHMETIC = "--ctx-size 2048 / --parallel 4 = 512"


def model(context_length: int = 1024) -> Any:
    raw: dict[str, Any] = {
        "name": "tiny",
        "source": "org/tiny",
        "profiles": [{"name": "cpu", "engine": "llamacpp"}],
    }
    if context_length:
        raw["context_length"] = context_length
    return parse_model(raw)


def placement(replica: int, **fields: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "replica": replica,
        "state": "ready",
        "endpoint": f"http://h:{replica}",
        "profile": "cpu",
        **fields,
    }


def table(context_length: int = 1024, *placements: dict[str, Any]) -> Table:
    return build([model(context_length)], list(placements), 1)


def chat(text: str, max_tokens: int | None = None) -> admission.Request:
    body: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": text}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return admission.parse_request(body, admission.CHAT)


def test_the_table_reads_each_replicas_effective_context_and_its_arithmetic() -> None:
    t = table(
        1024,
        placement(0, effective_context_length=512, context_detail=ARITHMETIC),
        placement(1),  # an older feed: nothing known
        placement(2, effective_context_length=None, context_detail=""),
    )
    assert [(r.context, r.context_detail) for r in t.ready["tiny"]] == [
        (512, ARITHMETIC),
        (None, ""),
        (None, ""),
    ]


@pytest.mark.parametrize(
    "value", [True, 0, -5, 1 << 40, "512", 512.0, [512], {"n": 1}, float("nan")]
)
def test_a_feed_value_that_is_not_a_context_length_leaves_the_catalogs_limit(value: Any) -> None:
    t = table(1024, placement(0, effective_context_length=value, context_detail="x" * 10_000))
    r = t.ready["tiny"][0]
    assert r.context is None and r.context_detail == ""
    assert admission.window(t.models["tiny"], t.ready["tiny"]).tokens == 1024


def test_a_long_context_detail_in_the_feed_is_cut() -> None:
    t = table(1024, placement(0, effective_context_length=512, context_detail="y" * 10_000))
    assert len(t.ready["tiny"][0].context_detail) == MAX_CONTEXT_DETAIL


def test_a_prompt_over_what_one_slot_gives_is_refused_naming_both_numbers_and_the_arithmetic() -> (
    None
):
    t = table(1024, placement(0, effective_context_length=512, context_detail=ARITHMETIC))
    m, w = t.models["tiny"], admission.window(t.models["tiny"], t.ready["tiny"])
    assert w.tokens == 512
    req = chat("x" * 600, max_tokens=4)
    assert admission.needs_count(req, m, w)
    with pytest.raises(Refusal) as refused:
        admission.fits(req, m, 600, "by the engine's tokenizer", w)
    r = refused.value
    assert (r.status, r.code, r.param) == (400, "context_length_exceeded", "messages")
    assert r.message == (
        "model 'tiny': the prompt is 600 tokens (by the engine's tokenizer) plus max_tokens 4, "
        "above 512, what one request may use on replica tiny/0 (--ctx-size 2048 / --parallel 4 "
        "= 512 < context_length 1024: the smaller of the two is the limit); shorten the prompt "
        "or ask for fewer tokens"
    )
    # Under the catalog's 1024 alone it would have been admitted.
    admission.fits(req, m, 600, "by the engine's tokenizer")
    admission.fits(req, m, 508, "by the engine's tokenizer", w)  # 508 + 4 = 512: fits


def test_the_tightest_ready_replica_sets_the_window_and_a_larger_one_leaves_the_catalogs() -> None:
    t = table(
        1024,
        placement(0, effective_context_length=4096, context_detail="--ctx-size 4096 / 1"),
        placement(1, effective_context_length=700, context_detail="--ctx-size 2800 / 4 = 700"),
        placement(2, effective_context_length=900),
    )
    w = admission.window(t.models["tiny"], t.ready["tiny"])
    assert w.tokens == 700 and "replica tiny/1 (--ctx-size 2800 / 4 = 700 <" in w.why
    roomy = table(1024, placement(0, effective_context_length=4096))
    assert admission.window(roomy.models["tiny"], roomy.ready["tiny"]) == admission.Window(
        1024, "its context_length 1024"
    )
    # No replica ready (or none that said): the catalog's limit, as before.
    assert admission.window(t.models["tiny"], ()).tokens == 1024


def test_without_a_declared_context_length_the_engines_figure_is_the_limit() -> None:
    t = table(0, placement(0, effective_context_length=512))
    w = admission.window(t.models["tiny"], t.ready["tiny"])
    assert w.tokens == 512
    assert "its engine gives one request 512; the catalog declares no context_length" in w.why
    assert admission.window(t.models["tiny"], ()).tokens == 0  # no limit at all


@given(
    declared=st.integers(0, 5000),
    effective=st.lists(st.one_of(st.none(), st.integers(1, 5000)), max_size=4),
    prompt=st.integers(0, 6000),
    max_tokens=st.integers(1, 100),
)
@settings(max_examples=300, deadline=None)
def test_admitted_means_within_the_catalog_and_every_ready_replica(
    declared: int, effective: list[int | None], prompt: int, max_tokens: int
) -> None:
    t = table(
        declared,
        *(placement(i, effective_context_length=e) for i, e in enumerate(effective)),
    )
    m = t.models["tiny"]
    w = admission.window(m, t.ready["tiny"] if effective else ())
    req = chat("x", max_tokens=max_tokens)
    limits = [x for x in [declared or None, *effective] if x is not None]
    try:
        admission.fits(req, m, prompt, "counted", w)
    except Refusal as refused:
        assert limits and prompt + max_tokens > min(limits)
        assert str(min(limits)) in refused.message
    else:
        assert all(prompt + max_tokens <= x for x in limits)
    # The bound alone never admits what the window refuses.
    if not admission.needs_count(req, m, w):
        assert not limits or admission.upper_bound(req) + max_tokens <= min(limits)
