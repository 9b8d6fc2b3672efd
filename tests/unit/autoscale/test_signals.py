"""A gateway's signals body: every bound checked, nothing partial, every problem named."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscale.signals import (
    MAX_REPLICAS,
    MAX_WINDOWS,
    MAX_WORKERS,
    SignalsError,
    identity,
    parse_signals,
)

W = {"model": "chat", "start": "2026-12-04T10:00:00Z", "end": "2026-12-04T10:00:05Z"}


def test_a_valid_report_parses_with_defaults_for_what_it_leaves_out() -> None:
    s = parse_signals({"gateway": "gw-1", "windows": [{**W, "requests": 3, "ttft_p99_s": None}]})
    assert s.gateway == "gw-1" and s.windows[0].requests == 3 and s.windows[0].waiting == 0
    assert parse_signals({"gateway": "gw-1", "windows": []}).windows == ()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"windows": []}, "gateway None must be"),
        ({"gateway": "gw 1", "windows": []}, "gateway 'gw 1' must be"),
        ({"gateway": "g", "windows": {}}, "windows must be a list"),
        ({"gateway": "g", "windows": [], "x": 1}, "unknown key(s) 'x'"),
        ({"gateway": "g", "windows": [{**W, "requests": -1}]}, "windows[0].requests must be"),
        ({"gateway": "g", "windows": [{**W, "requests": True}]}, "windows[0].requests must be"),
        ({"gateway": "g", "windows": [{**W, "errors": 2}]}, "errors (2) cannot exceed requests"),
        ({"gateway": "g", "windows": [{**W, "start": "yesterday"}]}, "is not an ISO 8601 time"),
        ({"gateway": "g", "windows": [{**W, "end": "2026-12-04T10:00:05"}]}, "has no zone"),
        ({"gateway": "g", "windows": [{**W, "end": W["start"]}]}, "end must be after start"),
        ({"gateway": "g", "windows": [{**W, "ttft_p99_s": 1e9}]}, "ttft_p99_s must be a number"),
        ({"gateway": "g", "windows": [{**W, "model": "a\nb"}]}, "model must be the model's"),
        ({"gateway": "g", "windows": [{**W, "replicas": {"r": {"x": 1}}}]}, "replicas['r']"),
        ({"gateway": "g", "windows": [W] * (MAX_WINDOWS + 1)}, f"at most {MAX_WINDOWS}"),
        (
            {"gateway": "g", "windows": [{**W, "replicas": {str(i): {} for i in range(1001)}}]},
            f"at most {MAX_REPLICAS}",
        ),
    ],
)
def test_a_bad_report_is_refused_whole_naming_the_field(body: dict[str, Any], words: str) -> None:
    with pytest.raises(SignalsError) as refused:
        parse_signals(body)
    assert words in str(refused.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)


WINDOW = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["chat", ""]),
        "start": st.just(W["start"]),
        "end": st.sampled_from([W["end"], W["start"], "x"]),
    },
    optional=dict.fromkeys(
        ("requests", "errors", "waiting", "inflight_mean", "ttft_p99_s", "replicas"), json_values
    ),
)


@given(
    st.fixed_dictionaries(
        {"gateway": st.sampled_from(["gw-1", "", 3]), "windows": st.lists(WINDOW, max_size=3)}
    )
)
def test_any_body_is_refused_or_parsed_into_values_within_the_bounds(body: dict[str, Any]) -> None:
    try:
        s = parse_signals(body)
    except SignalsError as exc:
        assert exc.problems
        return
    for w in s.windows:
        assert 0 <= w.errors <= w.requests and w.end > w.start
        assert w.ttft_p99_s is None or 0 <= w.ttft_p99_s <= 86_400
        assert len(w.replicas) <= MAX_REPLICAS


@given(st.integers(0, MAX_WORKERS - 1), st.sampled_from(["gw-1", "gw-fake9", "x"]))
def test_who_posted_is_the_tokens_name_and_the_worker_never_the_body(
    worker: int, label: str
) -> None:
    s = parse_signals({"gateway": label, "worker": worker, "windows": [W]})
    assert s.worker == worker and s.gateway == label
    poster = identity("gw-a", worker)
    assert poster == f"gw-a-w{worker}"
    assert all(w.gateway == poster for w in s.received(datetime.now(UTC), poster))
    # A body without worker is worker 0 (one gateway process, or a gateway before it).
    assert parse_signals({"gateway": label, "windows": []}).worker == 0


@given(
    st.one_of(
        st.integers(max_value=-1),
        st.integers(min_value=MAX_WORKERS),
        st.booleans(),
        st.floats(),
        st.text(max_size=3),
        st.none(),
    )
)
def test_a_worker_outside_the_tokens_limit_is_refused_naming_it(worker: object) -> None:
    with pytest.raises(SignalsError) as caught:
        parse_signals({"gateway": "g", "worker": worker, "windows": []})
    assert f"from 0 to {MAX_WORKERS - 1}" in str(caught.value)
    assert "its own token" in str(caught.value)
