"""The quota stage's rules on a clock passed in (gateway.stages.quota) and the stream's
usage event cut out again (gateway.usage): what a request reserves, what a limit
refuses and names, what settlement gives back, and OpenAI's headers going down and up."""

from __future__ import annotations

import pytest

from catalog.forms.client_limits import ClientLimits
from gateway.stages import admission
from gateway.stages.admission import Refusal, Window
from gateway.stages.quota import DEFAULT_COMPLETION, Quotas, reservation
from gateway.table import ModelEntry, build
from gateway.usage import Events, Usage, ask
from tests.unit.gateway.test_admission_routing import model


def chat(max_tokens: int | None = None, text: str = "hello there") -> admission.Request:
    body: dict[str, object] = {"model": "chat", "messages": [{"role": "user", "content": text}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return admission.parse_request(body, admission.CHAT)


def entry(**fields: object) -> ModelEntry:
    return build([model("chat", **fields)], [], 1).models["chat"]


def test_a_request_reserves_its_prompt_and_its_completion_bound() -> None:
    req = chat(max_tokens=50)
    prompt = admission.estimate(req)
    assert reservation(req, entry(), None, Window(0, "")) == (prompt + 50, prompt)
    assert reservation(req, entry(), 7, Window(0, "")) == (57, 7)  # as admission counted
    bare = chat()
    assert reservation(bare, entry(max_output=300), 7, Window(0, "")) == (307, 7)
    assert reservation(bare, entry(), 7, Window(1000, "")) == (1000, 7)  # context left
    assert reservation(bare, entry(), 7, Window(0, "")) == (7 + DEFAULT_COMPLETION, 7)


def test_requests_a_minute_refuse_with_the_limit_named_and_refill() -> None:
    q, limits = Quotas(), ClientLimits(rpm=2)
    q.admit("a", limits, "chat", 10, prompt=5, now=0.0)
    q.admit("a", limits, "chat", 10, prompt=5, now=0.0)
    with pytest.raises(Refusal) as refused:
        q.admit("a", limits, "chat", 10, prompt=5, now=1.0)
    r = refused.value
    assert (r.status, r.code, r.retry_after) == (429, "rate_limit_requests", 29)
    assert "2 requests a minute" in r.message
    q.admit("a", limits, "chat", 10, prompt=5, now=30.0)  # one refilled after 30 s
    q.admit("b", limits, "chat", 10, prompt=5, now=1.0)  # another client: its own


def test_tokens_settle_to_the_engines_usage_and_the_headers_follow() -> None:
    q, limits = Quotas(), ClientLimits(rpm=100, tpm=1000)
    headers = dict(q.headers("a", limits, "chat", 0.0))
    assert headers[b"x-ratelimit-remaining-tokens"] == b"1000"
    ticket = q.admit("a", limits, "chat", 800, prompt=100, now=0.0)
    headers = dict(q.headers("a", limits, "chat", 0.0))
    assert headers[b"x-ratelimit-limit-tokens"] == b"1000"
    assert headers[b"x-ratelimit-remaining-tokens"] == b"200"
    assert headers[b"x-ratelimit-remaining-requests"] == b"99"
    assert headers[b"x-ratelimit-reset-tokens"] == b"48s"
    assert headers[b"x-ratelimit-reset-requests"] == b"600ms"
    with pytest.raises(Refusal) as refused:
        q.admit("a", limits, "chat", 300, prompt=100, now=0.0)
    assert refused.value.code == "rate_limit_tokens" and refused.value.retry_after == 6
    q.settle(ticket, 150, 0.0)  # the engine used 150 of the 800 reserved
    assert dict(q.headers("a", limits, "chat", 0.0))[b"x-ratelimit-remaining-tokens"] == b"850"
    q.settle(ticket, 150, 0.0)  # once only
    assert dict(q.headers("a", limits, "chat", 0.0))[b"x-ratelimit-remaining-tokens"] == b"850"
    q.admit("a", limits, "chat", 300, prompt=100, now=0.0)
    with pytest.raises(Refusal) as refused:  # larger than the limit itself: says so
        q.admit("a", limits, "chat", 1001, prompt=1, now=0.0)
    assert "more than its limit tpm of 1000 a minute allows at once" in refused.value.message


def test_a_models_own_limit_max_inflight_and_the_budget() -> None:
    q = Quotas()
    limits = ClientLimits(model_tpm=(("chat", 100),), max_inflight=2, budget=500,
                          budget_period_s=3600)  # fmt: skip
    t1 = q.admit("a", limits, "chat", 60, prompt=10, now=0.0)
    q.admit("a", limits, "coder", 400, prompt=10, now=0.0)  # not chat's limit
    with pytest.raises(Refusal) as refused:
        q.admit("a", limits, "chat", 10, prompt=10, now=0.0)
    assert refused.value.code == "max_inflight"
    q.settle(t1, 60, 1.0)
    with pytest.raises(Refusal) as refused:
        q.admit("a", limits, "chat", 60, prompt=10, now=1.0)
    assert refused.value.code == "rate_limit_tokens" and "tpm chat" in refused.value.message
    with pytest.raises(Refusal) as refused:
        q.admit("a", limits, "coder", 60, prompt=10, now=1.0)
    assert refused.value.code == "budget_exhausted"
    # The budget's tokens leave the window with their slot (a 60th of the period).
    assert 0 < (refused.value.retry_after or 0) <= 60
    q.admit("a", limits, "coder", 60, prompt=10, now=3600 + 61.0)


def test_changed_limits_apply_at_once_and_keep_what_was_used() -> None:
    q = Quotas()
    q.admit("a", ClientLimits(tpm=1000), "chat", 900, prompt=10, now=0.0)
    with pytest.raises(Refusal):
        q.admit("a", ClientLimits(tpm=1000), "chat", 200, prompt=10, now=0.0)
    q.admit("a", ClientLimits(tpm=2000), "chat", 200, prompt=10, now=0.0)  # raised
    with pytest.raises(Refusal):  # lowered: what was used still counts
        q.admit("a", ClientLimits(tpm=1200), "chat", 200, prompt=10, now=0.0)


def test_a_streams_usage_event_is_cut_out_unless_asked_and_counted_either_way() -> None:
    content = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
    usage = (
        b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,'
        b'"prompt_tokens_details":{"cached_tokens":8}}}\n\n'
    )
    done = b"data: [DONE]\n\n"
    stream = content + usage + done
    for cut in range(1, len(stream)):  # however the engine's pieces fall
        for strip in (True, False):
            events = Events(strip)
            out = events.take(stream[:cut]) + events.take(stream[cut:]) + events.rest()
            assert out == (content + done if strip else stream)
            assert events.usage == Usage(12, 8, 3)
    events = Events(True)
    out, _held, found = events.peek(stream)
    assert events.usage is None and out == content + done and found == Usage(12, 8, 3)


def test_the_usage_event_is_asked_for_without_encoding_the_body_again() -> None:
    raw = b' {"model":"chat","stream":true}'
    assert ask({"model": "chat"}, raw) == (
        b' {"stream_options":{"include_usage":true},"model":"chat","stream":true}'
    )
    assert ask({"stream_options": {}}, raw) is None


def test_each_of_n_workers_holds_a_nth_of_every_limit() -> None:
    # `llmgw gateway --workers 2`: the workers share no memory; each holding half of a
    # limit, together they never serve more than it.
    q = Quotas(share=2)
    limits = ClientLimits(rpm=4, max_inflight=3)
    q.admit("a", limits, "chat", 1, prompt=1, now=0.0)
    with pytest.raises(Refusal) as refused:  # max_inflight 3: 1 on this worker
        q.admit("a", limits, "chat", 1, prompt=1, now=0.0)
    assert "max_inflight is 3 (1 on this worker)" in refused.value.message
    headers = dict(q.headers("a", limits, "chat", 0.0))
    assert headers[b"x-ratelimit-limit-requests"] == b"2"
