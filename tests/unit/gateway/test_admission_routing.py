"""The gateway's pure core: admission, the routing profiles, set-aside, signal windows.

No sockets: the functions take a table and a load view, as the edge hands them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.definition.parse import parse_model
from catalog.errors import CatalogError
from gateway.stages import admission
from gateway.stages.admission import Refusal
from gateway.stages.routing import Load, choose, eligible, observe_ttft, picked
from gateway.stages.setaside import SetAside
from gateway.table import Replica, Table, build, stable_hash
from gateway.windows import Windows


def model(name: str = "chat", **fields: Any) -> Any:
    raw = {
        "name": name,
        "source": f"org/{name}",
        "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM", "weight": 1}],
        **fields,
    }
    return parse_model(raw)


def table(*models: Any, ready: dict[str, int] | None = None) -> Table:
    placements = [
        {
            "model": m,
            "replica": i,
            "state": "ready",
            "endpoint": f"http://h:{i}",
            "profile": "sim",
        }
        for m, n in (ready or {}).items()
        for i in range(n)
    ]
    return build(models, placements, 1)


def replicas(n: int, weights: list[float] | None = None) -> list[Replica]:
    ws = weights or [1.0] * n
    return [
        Replica(f"m/{i}", "m", f"http://h:{i}", ws[i], "p", stable_hash(f"m/{i}")) for i in range(n)
    ]


# -- the catalog's rule -------------------------------------------------------------------


def test_an_unknown_routing_profile_is_refused_at_load_with_a_did_you_mean() -> None:
    with pytest.raises(CatalogError) as caught:
        model(routing_profile="least-load")
    assert "did you mean 'least-loaded'?" in caught.value.message
    assert caught.value.field == "routing_profile" and caught.value.model == "chat"
    for known in ("", "least-loaded", "round-robin", "session", "latency", "prefix"):
        model(routing_profile=known)


# -- resolution and admission -------------------------------------------------------------


def test_resolution_by_name_or_alias_and_refusals_name_the_model_field_and_limit() -> None:
    t = table(model(aliases=["assistant"], max_output=100, context_length=1000), model("b"))
    assert admission.resolve(t, "assistant", None).name == "chat"
    with pytest.raises(Refusal) as caught:
        admission.resolve(t, "chta", None)
    assert caught.value.status == 404 and "Did you mean 'chat'?" in caught.value.message
    with pytest.raises(Refusal) as caught:
        admission.resolve(t, "chat", frozenset({"b"}))
    assert caught.value.status == 403
    entry = t.models["chat"]
    req = admission.parse_request(
        {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 101},
        admission.CHAT,
    )
    with pytest.raises(Refusal) as caught:
        admission.admit(req, entry)
    assert "max_tokens 101 is above its max_output 100" in caught.value.message


@given(
    text=st.text(max_size=400),
    max_tokens=st.integers(1, 600),
    context=st.integers(50, 2000),
)
@settings(max_examples=200, deadline=None)
def test_the_upper_bound_never_admits_what_an_exact_count_would_refuse(
    text: str, max_tokens: int, context: int
) -> None:
    """A request decided without counting fits under any byte-level tokenizer: the bound
    is at least the bytes, and no byte-level tokenizer makes more tokens than bytes."""
    entry = table(model(context_length=context, max_output=min(600, context))).models["chat"]
    body: dict[str, Any] = {"model": "chat", "messages": [{"role": "user", "content": text}]}
    body["max_tokens"] = max_tokens
    req = admission.parse_request(body, admission.CHAT)
    if not admission.needs_count(req, entry):
        worst = len(text.encode("utf-8", "surrogatepass")) + admission.TEMPLATE_TOKENS + 8
        assert worst + max_tokens <= context


@given(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
        max_leaves=30,
    )
)
@settings(max_examples=200, deadline=None)
def test_any_json_body_is_admitted_or_refused_with_a_4xx_never_an_exception(body: Any) -> None:
    for kind in (admission.CHAT, admission.COMPLETIONS, admission.EMBEDDINGS):
        try:
            admission.parse_request(body, kind)
        except Refusal as refusal:
            assert 400 <= refusal.status < 500


def test_a_body_nested_deeper_than_the_limit_is_refused() -> None:
    deep: Any = "x"
    for _ in range(admission.MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(Refusal):
        admission.parse_request({"model": "m", "messages": deep}, admission.CHAT)


# -- routing ------------------------------------------------------------------------------


@given(st.lists(st.integers(0, 20), min_size=1, max_size=16), st.data())
def test_least_loaded_picks_the_fewest_in_flight_per_unit_of_weight(
    inflight: list[int], data: st.DataObject
) -> None:
    weights = data.draw(
        st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=len(inflight), max_size=len(inflight))
    )
    rs = replicas(len(inflight), weights)
    loads = {r.key: Load(inflight=n) for r, n in zip(rs, inflight, strict=True)}
    choice = choose("least-loaded", rs, loads)
    assert choice is not None
    best = min(n / w for n, w in zip(inflight, weights, strict=True))
    assert loads[choice.replica.key].inflight / choice.replica.weight == best


def test_round_robin_follows_weights() -> None:
    rs = replicas(3, [1.0, 2.0, 1.0])
    loads = {r.key: Load() for r in rs}
    picks: Counter[str] = Counter()
    for _ in range(400):
        choice = choose("round-robin", rs, loads)
        assert choice is not None
        picked(loads[choice.replica.key], 0.0)
        picks[choice.replica.key] += 1
    assert picks == {"m/0": 100, "m/1": 200, "m/2": 100}


@given(st.text(min_size=1, max_size=20), st.integers(2, 12), st.data())
def test_a_session_sticks_and_moves_only_when_its_replica_leaves(
    key: str, n: int, data: st.DataObject
) -> None:
    rs = replicas(n)
    first = choose("session", rs, {}, session=key)
    assert first is not None
    leaving = data.draw(st.sampled_from(rs))
    rest = [r for r in rs if r.key != leaving.key]
    after = choose("session", rest, {}, session=key)
    assert after is not None
    if leaving.key != first.replica.key:
        assert after.replica.key == first.replica.key  # stays
    assert choose("session", list(reversed(rs)), {}, session=key).replica == first.replica  # type: ignore[union-attr]


def test_latency_predicts_from_queue_and_rate_and_says_when_the_slo_is_missed() -> None:
    rs = replicas(2)
    loads = {r.key: Load() for r in rs}
    observe_ttft(loads["m/0"], 0.2, 0)  # 0.2 s per queued request
    observe_ttft(loads["m/1"], 0.1, 0)
    loads["m/0"].inflight, loads["m/1"].inflight = 0, 3  # 0.2 vs 0.4
    choice = choose("latency", rs, loads, ttft_slo_s=0.3)
    assert choice is not None and choice.replica.key == "m/0" and choice.meets_slo
    loads["m/0"].inflight = 5  # 1.2 s vs 0.4 s: both above 0.3
    choice = choose("latency", rs, loads, ttft_slo_s=0.3)
    assert choice is not None and choice.replica.key == "m/1" and not choice.meets_slo


def test_a_failing_replica_is_set_aside_for_a_growing_while_and_comes_back_when_it_answers() -> (
    None
):
    rs = replicas(2)
    loads = {r.key: Load() for r in rs}
    aside = SetAside(base_s=1, max_s=8)
    assert aside.failed("m/0", loads["m/0"], 100.0) == 101.0
    assert eligible(rs, loads, 100.5) == [rs[1]]
    assert aside.failed("m/0", loads["m/0"], 101.0) == 103.0
    for _ in range(10):
        until = aside.failed("m/0", loads["m/0"], 200.0)
    assert until == 208.0
    assert eligible(rs, loads, 208.0) == rs  # its while is over: tried again
    aside.answered("m/0", loads["m/0"])
    assert aside.count("m/0") == 0 and loads["m/0"].set_aside_until == 0


def test_the_table_takes_ready_replicas_only_and_the_feeds_weight_over_the_profiles() -> None:
    m = model()
    placements = [
        {
            "model": "chat",
            "replica": 0,
            "state": "ready",
            "endpoint": "http://a/",
            "profile": "sim",
        },
        {"model": "chat", "replica": 1, "state": "starting", "endpoint": None, "profile": "sim"},
        {
            "model": "chat",
            "replica": 2,
            "state": "draining",
            "endpoint": "http://c",
            "profile": "sim",
        },
        {
            "model": "chat",
            "replica": 3,
            "state": "ready",
            "endpoint": "http://d",
            "profile": "sim",
            "weight": 3.5,
        },
        {"model": "gone", "replica": 0, "state": "ready", "endpoint": "http://e", "profile": "sim"},
    ]
    t = build([m], placements, 7)
    assert [(r.key, r.endpoint, r.weight) for r in t.ready["chat"]] == [
        ("chat/0", "http://a", 1.0),
        ("chat/3", "http://d", 3.5),
    ]
    assert t.coming == {"chat": 1} and "gone" not in t.ready


def test_signal_windows_summarise_requests_in_flight_and_latencies() -> None:
    w = Windows(0.0, 1_700_000_000.0)
    w.started("chat", 0.0)
    w.sent("chat", "chat/0", 0.0, 0.001)
    w.started("chat", 1.0)
    w.waited("chat", 1.0)
    w.replied("chat", "chat/0", 2.0)
    w.finished("chat", 2.0, error=False)
    w.timing("chat", 2.0, 0.5, 0.01)
    (window,) = w.close(4.0, 1_700_000_004.0)
    # Requests are counted when they finish (errors are among them): one of the two.
    assert window["model"] == "chat" and window["requests"] == 1 and window["waiting"] == 1
    assert window["inflight_max"] == 2
    assert window["inflight_mean"] == pytest.approx((1 * 1 + 2 * 1 + 1 * 2) / 4)
    assert window["ttft_p99_s"] == 0.5 and window["tpot_p99_s"] == 0.01
    assert window["replicas"]["chat/0"] == {"requests": 1, "inflight_mean": 0.5, "inflight_max": 1}
    assert window["start"].endswith("Z") and window["end"] > window["start"]
    # The one still in flight carries into the next window.
    (carried,) = w.close(8.0, 1_700_000_008.0)
    assert carried["requests"] == 0 and carried["inflight_mean"] == 1.0
