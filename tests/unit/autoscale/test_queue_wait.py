"""Scaling up for the gateways' queue: a model whose queue wait p99 stays above its
``slo.ttft_p99`` (or the policy's ``default_queue_wait``) for two consecutive windows of
one gateway gets a replica, recorded with the code ``queue_wait``; one long window alone
does not, and the figure is the same however the windows were folded (the backtest
replays it)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from autoscale.decide import Last, Limits, decide, queue_limit, queue_over
from autoscale.policy import DEFAULT_POLICY, ModelPolicy, parse_policy
from autoscale.rolling import Rolling
from autoscale.rounds import ModelState, decide_round, judged_summary
from autoscale.windows import Summary, Window, sustained_queue_wait
from tests.unit.autoscale.test_decide import limits, policies, summaries

T0 = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
STEP = timedelta(seconds=5)
POLICY = ModelPolicy(target=0.5, up_step=2, down_step=1, default_capacity=4)
LIMITS = Limits(min=1, max=6, ttft_p99_s=1.0, tpot_p99_s=0.1, capacity=4, capacity_source="bench")
OLD = Last(changed_at=T0 - timedelta(hours=1))


def window(gateway: str, index: int, queue: float | None, requests: int = 10) -> Window:
    """The gateway's ``index``-th 5 s window: windows of one gateway follow each other."""
    start = T0 + index * STEP
    return Window(
        gateway, "m", start, start + STEP, start + STEP, requests=requests,
        inflight_mean=3.0, inflight_max=4, queue_wait_p99_s=queue, ttft_p99_s=0.2,
        tpot_p99_s=0.02, replica_count=2,
    )  # fmt: skip


def queued(sustained: float | None, top: float | None = None, **kw: Any) -> Summary:
    """A summary at a load two replicas carry (2 needed at 0.5 x 4) with this queue."""
    base: dict[str, Any] = {"windows": 12, "gateways": 1, "requests": 100, "load": 3.0}
    base["replicas"] = 2
    base.update(kw)
    return Summary(
        queue_wait_p99_s=top if top is not None else sustained,
        queue_wait_sustained_s=sustained,
        **base,
    )


def test_two_consecutive_windows_of_one_gateway_hold_the_lower_of_their_two_p99s() -> None:
    ws = [window("gw-1", 0, 0.1), window("gw-1", 1, 3.0), window("gw-1", 2, 2.0)]
    assert sustained_queue_wait(ws) == 2.0
    # One long window alone is a burst, not a queue that stayed.
    assert sustained_queue_wait([window("gw-1", 0, 0.1), window("gw-1", 1, 3.0)]) == 0.1
    assert sustained_queue_wait([window("gw-1", 1, 3.0)]) is None
    # A gap between them (a window with no traffic was not posted): not consecutive.
    assert sustained_queue_wait([window("gw-1", 0, 3.0), window("gw-1", 2, 3.0)]) is None
    # Two gateways' windows at the same times are two queues, each with one long window.
    assert sustained_queue_wait([window("gw-1", 0, 3.0), window("gw-2", 1, 3.0)]) is None
    # A window that served nothing is not counted, as for the other p99s.
    assert sustained_queue_wait([window("gw-1", 0, 3.0), window("gw-1", 1, 3.0, 0)]) is None


gateway_windows = st.lists(
    st.tuples(
        st.sampled_from(["gw-1", "gw-2"]),
        st.integers(0, 12),
        st.none() | st.floats(0, 20, allow_nan=False),
        st.integers(0, 3),
    ).map(lambda t: window(*t)),
    max_size=30,
)


@given(gateway_windows, st.randoms(use_true_random=False))
def test_the_sustained_queue_wait_is_a_function_of_the_set_of_windows_and_below_their_max(
    ws: list[Window], rnd: random.Random
) -> None:
    shuffled = ws[:]
    rnd.shuffle(shuffled)
    found = sustained_queue_wait(ws)
    assert sustained_queue_wait(shuffled) == found
    counted = [
        (w.gateway, w.start, w.end, w.queue_wait_p99_s)
        for w in ws
        if w.requests > 0 and w.queue_wait_p99_s is not None
    ]
    # What the definition says, pair by pair.
    pairs = [
        min(qa, qb)
        for ga, _, ea, qa in counted
        for gb, sb, _, qb in counted
        if ga == gb and ea == sb
    ]
    assert found == (max(pairs) if pairs else None)
    # Never above the highest p99 (the summary's): a round takes it only above the limit.
    if found is not None:
        assert found <= max(q for *_, q in counted)


@given(gateway_windows, st.integers(1, 5), st.integers(0, 12))
def test_the_running_windows_give_the_figure_of_the_live_set_however_folded(
    ws: list[Window], batches: int, cut: int
) -> None:
    ordered = sorted(ws, key=lambda w: w.received_at)
    rolling = Rolling()
    size = max(1, len(ordered) // batches)
    for i in range(0, len(ordered), size):
        rolling.add(ordered[i : i + size])
    after = T0 + cut * STEP
    rolling.expire(after)
    live = [w for w in ordered if w.received_at > after]
    assert rolling.sustained_queue_wait("m") == sustained_queue_wait(live)
    assert Rolling.of(live).sustained_queue_wait("m") == sustained_queue_wait(live)


def test_a_queue_wait_above_the_ttft_slo_in_two_windows_adds_a_replica_coded_queue_wait() -> None:
    d = decide("m", queued(2.5, top=4.0), 2, LIMITS, POLICY, last=OLD, now=T0)
    assert (d.action, d.wanted, d.code) == ("up", 3, "queue_wait")
    assert d.breaches == ("queue wait p99 2.500s > 1s in two consecutive windows",)
    assert d.reason == "up 2 -> 3: queue wait p99 2.500s > 1s in two consecutive windows"
    # The highest window above it, but no two consecutive ones: not a queue that stayed.
    d = decide("m", queued(0.4, top=4.0), 2, LIMITS, POLICY, last=OLD, now=T0)
    assert (d.action, d.code) == ("hold", "steady")


def test_with_no_ttft_slo_the_policy_default_queue_wait_is_the_limit() -> None:
    no_slo = Limits(min=1, max=6, capacity=4)
    assert queue_limit(no_slo, POLICY) == 2.0  # the default: 2s
    assert queue_limit(LIMITS, POLICY) == 1.0
    assert decide("m", queued(1.5), 2, no_slo, POLICY, last=OLD, now=T0).code == "steady"
    assert decide("m", queued(2.5), 2, no_slo, POLICY, last=OLD, now=T0).code == "queue_wait"
    patient = parse_policy({"default_queue_wait": "10s"}).for_model("m")
    assert decide("m", queued(2.5), 2, no_slo, patient, last=OLD, now=T0).code == "steady"
    assert DEFAULT_POLICY.to_json()["default_queue_wait"] == "2s"


def test_load_wins_the_code_and_replicas_still_starting_or_the_cooldown_hold_it() -> None:
    # The load alone asks for more: the code is load, the queue is among the breaches.
    d = decide("m", queued(2.5, load=8.0), 2, LIMITS, POLICY, last=OLD, now=T0)
    assert (d.code, d.wanted) == ("load", 4)
    assert d.breaches[0].startswith("queue wait p99")
    # Asked-for replicas not serving yet: they are what the queue waits for.
    d = decide("m", queued(2.5, replicas=1), 3, LIMITS, POLICY, last=OLD, now=T0)
    assert (d.action, d.code) == ("hold", "starting")
    recent = Last(changed_at=T0 - timedelta(seconds=5))
    d = decide("m", queued(2.5), 2, LIMITS, POLICY, last=recent, now=T0)
    assert (d.action, d.code) == ("hold", "cooldown") and "(queue_wait)" in d.reason
    # Never down while a queue stays long, whatever the load.
    d = decide("m", queued(2.5, load=0.1), 4, LIMITS, POLICY, last=OLD, now=T0)
    assert d.wanted >= 4


def test_a_model_at_zero_replicas_still_wakes_for_a_waiting_request() -> None:
    zero = Limits(min=0, max=3, ttft_p99_s=1.0)
    woke = decide("m", queued(5.0, waiting=1), 0, zero, POLICY, last=OLD, now=T0)
    assert (woke.action, woke.wanted, woke.code) == ("up", 1, "waiting")


@given(summaries, st.integers(0, 40), limits(), policies)
def test_a_queue_at_or_below_its_limit_changes_nothing_and_a_longer_one_never_lowers(
    summary: Summary | None, current: int, limit: Limits, policy: ModelPolicy
) -> None:
    if summary is None:
        return
    bare = summary._replace(queue_wait_sustained_s=None)
    plain = decide("m", bare, current, limit, policy, last=OLD, now=T0)
    line = queue_limit(limit, policy)
    below = decide(
        "m", summary._replace(queue_wait_sustained_s=line), current, limit, policy, last=OLD, now=T0
    )
    assert below == plain
    above = decide(
        "m", summary._replace(queue_wait_sustained_s=line + 1), current, limit, policy,
        last=OLD, now=T0,
    )  # fmt: skip
    assert above.wanted >= plain.wanted
    assert limit.min <= above.wanted <= max(limit.max, limit.min)
    if above.code == "queue_wait":
        assert above.action == "up" and above.wanted > current
        assert queue_over(summary._replace(queue_wait_sustained_s=line + 1), line)


def test_a_round_scales_up_at_the_second_long_window_of_a_gateway_not_the_first() -> None:
    limits_ = {"m": LIMITS}
    policy = parse_policy({"interval": "5s", "window": "20s", "target": 0.5})
    first = [window("gw-1", 0, 0.05), window("gw-1", 1, 3.0)]
    rolling = Rolling.of(first)
    state = {"m": ModelState(2, T0 - timedelta(hours=1))}
    ((d, s),) = decide_round(T0 + 2 * STEP, policy, limits_, rolling, heard=True, state=state)
    assert (d.code, d.wanted) == ("steady", 2) and s is not None
    assert s.queue_wait_p99_s == 3.0 and s.queue_wait_sustained_s == 0.05
    rolling.add([window("gw-1", 2, 2.0)])
    ((d, s),) = decide_round(T0 + 3 * STEP, policy, limits_, rolling, heard=True, state=state)
    assert (d.code, d.wanted) == ("queue_wait", 3), d
    assert s is not None and s.queue_wait_sustained_s == 2.0
    assert state["m"].wanted == 3
    # What a round records reads back the same (the backtest's and explain's input).
    assert Summary.from_json(s.to_json()) == s


def test_a_short_queue_is_not_walked_the_summary_says_so_with_none() -> None:
    rolling = Rolling.of([window("gw-1", 0, 0.5), window("gw-1", 1, 0.6)])
    s = judged_summary("m", rolling, True, LIMITS, POLICY)
    assert s is not None and s.queue_wait_p99_s == 0.6 and s.queue_wait_sustained_s is None
