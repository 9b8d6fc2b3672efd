"""The decision function: its bounds as properties, its rules as examples."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from autoscale.decide import Last, Limits, decide, needed_replicas
from autoscale.policy import ModelPolicy
from autoscale.windows import EMPTY, Summary

T0 = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
POLICY = ModelPolicy(target=0.5, up_step=2, down_step=1, default_capacity=4)
LIMITS = Limits(min=1, max=6, ttft_p99_s=1.0, tpot_p99_s=0.1, capacity=4, capacity_source="bench")

latency = st.none() | st.floats(0, 10, allow_nan=False)
summaries = st.none() | st.builds(
    Summary,
    windows=st.integers(0, 50),
    gateways=st.integers(0, 4),
    requests=st.integers(0, 10_000),
    errors=st.just(0),
    waiting=st.integers(0, 20),
    load=st.floats(0, 1000, allow_nan=False),
    inflight_max=st.integers(0, 1000),
    replicas=st.integers(0, 30),
    queue_wait_p99_s=latency,
    ttft_p99_s=latency,
    tpot_p99_s=latency,
)
policies = st.builds(
    ModelPolicy,
    target=st.floats(0.05, 1.0),
    up_step=st.integers(1, 10),
    down_step=st.integers(1, 10),
    up_cooldown=st.timedeltas(timedelta(0), timedelta(minutes=10)),
    down_cooldown=st.timedeltas(timedelta(0), timedelta(minutes=10)),
    default_capacity=st.floats(0.5, 100),
)


# What `limits` draws, built once (the upper bound once per lower): built in the
# composite, each was a new strategy that hypothesis validated again on every draw.
_LO = st.integers(0, 20)
_HI_OVER = {lo: st.integers(lo, 40) for lo in range(21)}
_TTFT = st.none() | st.floats(0.01, 5)
_TPOT = st.none() | st.floats(0.001, 1)
_CAPACITY = st.none() | st.floats(0.5, 64)


@st.composite
def limits(draw: st.DrawFn) -> Limits:
    lo = draw(_LO)
    hi = draw(_HI_OVER[lo])
    return Limits(
        min=lo,
        max=hi,
        ttft_p99_s=draw(_TTFT),
        tpot_p99_s=draw(_TPOT),
        capacity=draw(_CAPACITY),
    )


lasts = st.builds(Last, changed_at=st.none() | st.just(T0 - timedelta(seconds=30)))


@given(summaries, st.integers(0, 40), limits(), policies, lasts)
def test_a_decision_stays_within_min_and_max_and_never_steps_further_than_the_policy(
    summary: Summary | None, current: int, limit: Limits, policy: ModelPolicy, last: Last
) -> None:
    d = decide("m", summary, current, limit, policy, last=last, now=T0)
    assert limit.min <= d.wanted <= limit.max
    base = min(max(current, limit.min), limit.max)
    if current == base:  # bounds moved under it: following them is not a step
        assert d.wanted - base <= max(policy.up_step, 1)
        assert base - d.wanted <= policy.down_step
    assert d.changes == (d.wanted != current)


@given(summaries, st.integers(0, 40), limits(), policies, lasts)
def test_the_same_inputs_give_the_same_decision_and_are_left_unchanged(
    summary: Summary | None, current: int, limit: Limits, policy: ModelPolicy, last: Last
) -> None:
    inputs = copy.deepcopy((summary, current, limit, policy, last))
    first = decide("m", summary, current, limit, policy, last=last, now=T0)
    again = decide("m", summary, current, limit, policy, last=last, now=T0)
    assert first == again
    assert (summary, current, limit, policy, last) == inputs


@given(summaries, limits(), policies)
def test_a_decision_inside_the_cooldown_never_goes_down(
    summary: Summary | None, limit: Limits, policy: ModelPolicy
) -> None:
    current = limit.max
    just_now = Last(changed_at=T0 - policy.down_cooldown / 2 if policy.down_cooldown else None)
    d = decide("m", summary, current, limit, policy, last=just_now, now=T0)
    if policy.down_cooldown > timedelta(0):
        assert d.wanted >= current


def load(value: float, **kw: object) -> Summary:
    return Summary(windows=12, gateways=1, requests=100, load=value, **kw)  # type: ignore[arg-type]


def test_load_beyond_the_target_share_of_capacity_raises_it_by_at_most_the_step() -> None:
    # 8 in flight at 0.5 x 4 per replica needs 4 replicas; the step allows 1 -> 3.
    d = decide("m", load(8, replicas=1), 1, LIMITS, POLICY, last=Last(), now=T0)
    assert (d.action, d.wanted, d.code, d.needed) == ("up", 3, "load", 4)
    assert "load 8.00" in d.reason and "target 0.5" in d.reason


def test_it_never_goes_above_max_and_says_so() -> None:
    d = decide("m", load(100, replicas=6), 6, LIMITS, POLICY, last=Last(), now=T0)
    assert (d.action, d.wanted, d.code) == ("hold", 6, "at_max")
    assert "scaling.max is 6" in d.reason


def test_an_slo_breach_adds_a_replica_even_at_low_load_once_every_replica_serves() -> None:
    breached = load(1, replicas=2, ttft_p99_s=2.5)
    d = decide("m", breached, 2, LIMITS, POLICY, last=Last(), now=T0)
    assert (d.action, d.wanted, d.code) == ("up", 3, "slo")
    assert d.breaches == ("ttft p99 2.500s > 1s",)


def test_a_breach_while_asked_for_replicas_are_still_starting_waits_for_them() -> None:
    d = decide("m", load(1, replicas=1, ttft_p99_s=2.5), 3, LIMITS, POLICY, last=Last(), now=T0)
    assert (d.action, d.wanted, d.code) == ("hold", 3, "starting")


def test_down_waits_for_the_cooldown_then_steps_down_to_what_carries_the_load() -> None:
    recent = Last(changed_at=T0 - timedelta(seconds=60))
    d = decide("m", load(1, replicas=4), 4, LIMITS, POLICY, last=recent, now=T0)
    assert (d.action, d.code) == ("hold", "cooldown")
    assert "down_cooldown 300s" in d.reason
    old = Last(changed_at=T0 - timedelta(minutes=6))
    d = decide("m", load(1, replicas=4), 4, LIMITS, POLICY, last=old, now=T0)
    assert (d.action, d.wanted, d.code) == ("down", 3, "load")


def test_down_is_refused_while_the_slo_is_breached_or_requests_wait() -> None:
    old = Last(changed_at=T0 - timedelta(hours=1))
    breached = load(0.5, replicas=4, tpot_p99_s=0.5)
    assert decide("m", breached, 4, LIMITS, POLICY, last=old, now=T0).wanted >= 4
    waiting = load(0.5, replicas=4, waiting=2)
    assert decide("m", waiting, 4, LIMITS, POLICY, last=old, now=T0).wanted == 4


def test_idle_goes_to_zero_for_a_min_zero_model_and_a_waiting_request_wakes_it() -> None:
    zero = Limits(min=0, max=3, ttft_p99_s=1.0)
    old = Last(changed_at=T0 - timedelta(hours=1))
    d = decide("m", EMPTY, 1, zero, POLICY, last=old, now=T0)
    assert (d.action, d.wanted, d.code) == ("down", 0, "idle")
    # Woken at once, within the up cooldown: someone is waiting.
    just = Last(changed_at=T0 - timedelta(seconds=1))
    woke = decide("m", Summary(windows=1, waiting=1), 0, zero, POLICY, last=just, now=T0)
    assert (woke.action, woke.wanted, woke.code) == ("up", 1, "waiting")


def test_no_signal_holds_rather_than_reading_silence_as_idle() -> None:
    d = decide("m", None, 3, LIMITS, POLICY, last=Last(), now=T0)
    assert (d.action, d.wanted, d.code) == ("hold", 3, "no_signal")


def test_bounds_that_moved_are_followed_first() -> None:
    d = decide("m", load(0), 9, LIMITS, POLICY, last=Last(), now=T0)
    assert (d.wanted, d.code) == (6, "bounds")


def test_the_gap_between_up_and_down_keeps_a_steady_load_steady() -> None:
    # 3 replicas at 2 per replica each carry up to 6; 4.5 needs 3: neither up nor down.
    old = Last(changed_at=T0 - timedelta(hours=1))
    d = decide("m", load(4.5, replicas=3), 3, LIMITS, POLICY, last=old, now=T0)
    assert (d.action, d.code) == ("hold", "steady")
    assert needed_replicas(load(4.5), 4, 0.5) == 3
