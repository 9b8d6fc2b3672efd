"""The contract between what a gateway posts (``gateway.windows``) and what the control
plane accepts (``autoscale.signals``): whatever a gateway's requests do, in any order and
at any timing, every report it closes is accepted whole, and says what happened.

A report refused is a whole interval of signals lost (nothing partial is stored), so
this is a property over arbitrary request histories, not a few examples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscale.rolling import summarise
from autoscale.signals import parse_signals
from gateway.windows import Windows

MODELS = ["chat", "zero"]
REPLICAS = ["chat/0", "chat/1"]


@dataclass
class Live:
    """One request as the gateway's server and proxy drive the windows."""

    model: str
    replica: str | None = None
    steps: list[str] = field(default_factory=list)


ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["start", "wait", "send", "reply", "finish", "close"]),
        st.integers(0, 7),  # which request (by index) or model
        st.floats(0.0, 3.0),  # seconds since the last action (0: the same instant)
        st.booleans(),  # error / clock step
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ACTIONS, st.floats(-30.0, 30.0))
def test_every_report_a_gateway_closes_is_accepted_whole(
    actions: list[tuple[str, int, float, bool]], wall_step: float
) -> None:
    mono, wall = 100.0, 1_700_000_000.0
    w = Windows(mono, wall)
    live: list[Live] = []
    requests = errors = 0
    seen_requests = seen_errors = 0

    def close() -> None:
        nonlocal seen_requests, seen_errors
        windows = w.close(mono, wall)
        # The wall clock may step (NTP) between reports; the windows must still be valid.
        parsed = parse_signals({"gateway": "gw-1", "windows": windows})
        for got in parsed.windows:
            assert got.start < got.end
            seen_requests += got.requests
            seen_errors += got.errors
        summarise(parsed.received(datetime.now(UTC), "gw-1-w0"))

    for action, index, dt, flag in actions:
        mono += dt
        wall += dt
        if action == "start":
            live.append(Live(MODELS[index % 2]))
            w.started(live[-1].model, mono)
            continue
        if action == "close":
            if flag:
                wall += wall_step
            close()
            continue
        if not live:
            continue
        r = live[index % len(live)]
        if action == "wait" and "wait" not in r.steps and r.replica is None:
            r.steps.append("wait")
            w.waited(r.model, mono)
        elif action == "send" and r.replica is None:
            r.replica = REPLICAS[index % 2]
            w.sent(r.model, r.replica, mono, 0.01)
        elif action == "reply" and r.replica is not None and "reply" not in r.steps:
            r.steps.append("reply")
            w.replied(r.model, r.replica, mono)
        elif action == "finish":
            if r.replica is not None and "reply" not in r.steps:
                w.replied(r.model, r.replica, mono)
            w.finished(r.model, mono, error=flag)
            w.timing(r.model, mono, 0.2 if r.replica else None, 0.01 if r.replica else None)
            requests += 1
            errors += flag
            live.remove(r)
    for r in list(live):
        mono += 0.5
        if r.replica is not None and "reply" not in r.steps:
            w.replied(r.model, r.replica, mono)
        w.finished(r.model, mono, error=False)
        requests += 1
    mono += 0.5
    wall += 0.5
    close()
    # Every request is reported once, when it finished, errors among them.
    assert (seen_requests, seen_errors) == (requests, errors)


def test_an_idle_gateway_closes_an_empty_report_and_a_carried_request_keeps_its_model() -> None:
    w = Windows(0.0, 1_700_000_000.0)
    assert w.close(5.0, 1_700_000_005.0) == []
    w.started("chat", 6.0)
    (busy,) = w.close(10.0, 1_700_000_010.0)
    assert busy["requests"] == 0 and busy["inflight_max"] == 1
    w.finished("chat", 11.0, error=True)
    (done,) = w.close(15.0, 1_700_000_015.0)
    assert (done["requests"], done["errors"]) == (1, 1)
    parse_signals({"gateway": "gw-1", "windows": [busy, done]})
