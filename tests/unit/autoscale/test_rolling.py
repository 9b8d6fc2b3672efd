"""The running summaries (``autoscale.rolling``) are the summaries of the windows in the
window, to the bit, however they were folded in and out: the daemon folds window by
window as they arrive, a backtest (or a daemon that just took over) folds a whole window
at once, and a backtest with the policy that ran must make the recorded decisions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscale.rolling import Rolling, summarise
from autoscale.windows import Summary, Window

T0 = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
latency = st.none() | st.floats(0, 100, allow_nan=False)
# What `windows` draws, built once (the errors' bound once per request count): built in
# the composite, each was a new strategy that hypothesis validated again on every draw.
_RECEIVED_US = st.integers(0, 120_000_000)
_LENGTH_US = st.integers(1, 10_000_000)
_REQUESTS = st.integers(0, 50)
_ERRORS_OF = {requests: st.integers(0, requests) for requests in range(51)}
_GATEWAY = st.sampled_from(["gw-1", "gw-2", "gw-3"])
_MODEL = st.sampled_from(["a", "b"])
_WAITING = st.integers(0, 5)
_INFLIGHT_MEAN = st.floats(0, 1e4, allow_nan=False)
_INFLIGHT_MAX = st.integers(0, 100)
_REPLICAS = st.integers(0, 8)


@st.composite
def windows(draw: st.DrawFn) -> Window:
    received = T0 + timedelta(microseconds=draw(_RECEIVED_US))
    length = timedelta(microseconds=draw(_LENGTH_US))
    requests = draw(_REQUESTS)
    return Window(
        gateway=draw(_GATEWAY),
        model=draw(_MODEL),
        start=received - length,
        end=received,
        received_at=received,
        requests=requests,
        errors=draw(_ERRORS_OF[requests]),
        waiting=draw(_WAITING),
        inflight_mean=draw(_INFLIGHT_MEAN),
        inflight_max=draw(_INFLIGHT_MAX),
        queue_wait_p99_s=draw(latency),
        ttft_p99_s=draw(latency),
        tpot_p99_s=draw(latency),
        replica_count=draw(_REPLICAS),
    )


def _straightforward(ws: list[Window]) -> Summary:
    """One model's summary as the definitions in ``autoscale.windows`` say, one window
    at a time, with nothing kept between calls: what the batch folding must equal."""
    if not ws:
        return Summary()
    per_gateway: dict[str, list[int]] = {}
    for w in ws:
        us = max(0, (w.end - w.start) // timedelta(microseconds=1))
        micro = round(w.inflight_mean * 1_000_000)
        acc = per_gateway.setdefault(w.gateway, [0, 0, 0, 0])
        acc[0] += micro * us
        acc[1] += us
        acc[2] += micro
        acc[3] += 1
    load = 0.0
    for gateway in sorted(per_gateway):
        weighted, us, micro, n = per_gateway[gateway]
        load += weighted / (us * 1_000_000) if us > 0 else micro / (n * 1_000_000)

    def highest(values: list[float | None]) -> float | None:
        counted = [v for v in values if v is not None]
        return max(counted) if counted else None

    served = [w for w in ws if w.requests > 0]
    return Summary(
        windows=len(ws),
        gateways=len(per_gateway),
        requests=sum(w.requests for w in ws),
        errors=sum(w.errors for w in ws),
        waiting=max(w.waiting for w in ws),
        load=round(load, 6),
        inflight_max=max(w.inflight_max for w in ws),
        replicas=max(w.replica_count for w in ws),
        queue_wait_p99_s=highest([w.queue_wait_p99_s for w in served]),
        ttft_p99_s=highest([w.ttft_p99_s for w in served]),
        tpot_p99_s=highest([w.tpot_p99_s for w in served]),
    )


def _fresh(ws: list[Window], after: datetime, upto: datetime) -> dict[str, Summary]:
    live = [w for w in ws if after < w.received_at <= upto]
    return {m: summarise([w for w in live if w.model == m]) for m in {w.model for w in live}}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(windows(), max_size=60),
    st.lists(st.integers(1, 40), min_size=1, max_size=12),
    st.integers(5, 60),
)
def test_folding_window_by_window_gives_the_summaries_of_the_window_to_the_bit(
    ws: list[Window], steps: list[int], width: int
) -> None:
    rolling = Rolling()
    at = T0
    upto: datetime | None = None
    for step in steps:
        at += timedelta(seconds=step)
        after = at - timedelta(seconds=width)
        if upto is None:
            rolling.add(w for w in ws if w.received_at <= at)
        else:  # only what arrived since the last round, as the daemon reads it
            rolling.add(w for w in ws if upto < w.received_at <= at)
        rolling.expire(after)
        upto = at
        expected = _fresh(ws, after, at)
        assert {m: rolling.summary(m) for m in expected} == expected
        live = [w for w in ws if after < w.received_at <= at]
        plain = {m: _straightforward([w for w in live if w.model == m]) for m in expected}
        assert expected == plain
        assert set(rolling.models) == set(expected)
        # The same set folded at once (a daemon that just took over, a backtest).
        again = Rolling.of(w for w in ws if after < w.received_at <= at)
        assert {m: again.summary(m) for m in expected} == expected


@given(st.lists(windows(), min_size=1, max_size=30), st.randoms())
def test_the_order_windows_arrive_in_does_not_change_a_summary(
    ws: list[Window], rng: object
) -> None:
    shuffled = list(ws)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    late = Rolling.of(shuffled[: len(ws) // 2])
    late.add(shuffled[len(ws) // 2 :])  # some received before ones already held
    for model in {w.model for w in ws}:
        assert late.summary(model) == summarise([w for w in ws if w.model == model])


def test_a_summary_reads_load_per_gateway_weighted_by_time_and_the_highest_p99s() -> None:
    def w(gw: str, seconds: int, mean: float, ttft: float | None, requests: int = 5) -> Window:
        end = T0 + timedelta(seconds=seconds)
        return Window(gw, "a", end - timedelta(seconds=seconds), end, end, requests=requests,
                      inflight_mean=mean, ttft_p99_s=ttft)  # fmt: skip

    s = summarise([w("gw-1", 5, 2.0, 0.5), w("gw-1", 15, 4.0, 0.9, 0), w("gw-2", 5, 1.0, 0.2)])
    # gw-1: (2 x 5 + 4 x 15) / 20 = 3.5; gw-2: 1; they add. The p99 of a window that
    # served nothing is not counted.
    assert s.load == 4.5 and s.ttft_p99_s == 0.5 and s.gateways == 2 and s.windows == 3
    assert summarise([]) == Summary()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(windows(), max_size=25), min_size=1, max_size=10),
    st.integers(5, 60),
    st.lists(st.integers(-3, 3), min_size=10, max_size=10),
)
def test_batch_folding_equals_the_straightforward_summary_round_after_round(
    batches: list[list[Window]], width: int, jitter: list[int]
) -> None:
    """The daemon's shape: each round reads what arrived since the last as one batch, and
    the edge of the window falls anywhere (a round late or early), so batches leave whole
    or straddle it; every round's summaries equal the straightforward ones."""
    ordered = sorted((w for batch in batches for w in batch), key=lambda w: w.received_at)
    rolling = Rolling()
    upto = T0 - timedelta(seconds=1)
    for k in range(len(batches)):
        at = T0 + timedelta(seconds=12 * (k + 1) + jitter[k])
        rolling.add(w for w in ordered if upto < w.received_at <= at)
        after = at - timedelta(seconds=width)
        rolling.expire(after)
        upto = at
        live = [w for w in ordered if after < w.received_at <= at]
        models = {w.model for w in live}
        assert set(rolling.models) == models
        for m in models:
            assert rolling.summary(m) == _straightforward([w for w in live if w.model == m])
