"""Slow start: a replica that joins a model already served enters at the current turn and
ramps up over ``slow_start_s``, through the real ``State.install`` (as the follower
installs each table) and the real routing functions, with a clock the test moves."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from gateway.stages.routing import choose, eligible, picked
from gateway.state import State
from gateway.table import build
from tests.unit.gateway.test_admission_routing import model

WINDOW = 30.0


def rows(n: int) -> list[dict[str, Any]]:
    return [
        {"model": "chat", "replica": i, "state": "ready", "endpoint": f"http://h:{i}"}
        for i in range(n)
    ]


def serve(state: State, profile: str, start: float, seconds: float, rate: float) -> Counter[str]:
    """Requests at ``rate`` a second from ``start`` for ``seconds``, each answered before
    the next (idle replicas: least-loaded decides by its tie-break): picks per replica."""
    got: Counter[str] = Counter()
    for i in range(int(seconds * rate)):
        now = start + i / rate
        ready = state.table.ready["chat"]
        choice = choose(profile, eligible(ready, state.loads, now), state.loads, now=now)
        assert choice is not None
        picked(state.load(choice.replica.key), now)
        got[choice.replica.key] += 1
    return got


@pytest.mark.parametrize("profile", ["least-loaded", "round-robin"])
def test_a_new_replica_ramps_up_instead_of_taking_every_request(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three replicas served 3,000 requests; a fourth joins. It had zero picks, so it won
    # every tie and took every request until its picks caught up with the others'
    # (1,000 requests on a cold engine). Now it enters at the current turn and its
    # weight rises from 10% to all of it over the window, with no catch-up after.
    clock = [1000.0]
    monkeypatch.setattr("gateway.state.time.monotonic", lambda: clock[0])
    state = State("gw-test", slow_start_s=WINDOW)
    state.install(build([model("chat", routing_profile=profile)], rows(3), 1))
    serve(state, profile, 900.0, 30, 100)  # before the join: the first replicas, no ramp
    assert all(state.loads[f"chat/{i}"].warm_until == 0 for i in range(3))
    state.install(build([model("chat", routing_profile=profile)], rows(4), 2))

    first = serve(state, profile, 1000.0, 3, 100)  # its first 3 s: about 10% of its weight
    assert 0 < first["chat/3"] <= 0.06 * 300, first
    serve(state, profile, 1003.0, 27, 100)  # the rest of the window
    after = serve(state, profile, 1030.0, 10, 100)  # warm: an equal share, no catch-up
    assert 0.2 * 1000 <= after["chat/3"] <= 0.3 * 1000, after
    assert state.routing(1015.0)["models"]["chat"]["replicas"][3]["slow_start"] == 0.5


def test_a_models_first_replicas_and_a_window_of_zero_start_at_full_weight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("gateway.state.time.monotonic", lambda: clock[0])
    state = State("gw-test", slow_start_s=0.0)
    state.install(build([model("chat")], rows(1), 1))
    serve(state, "least-loaded", 900.0, 10, 100)
    state.install(build([model("chat")], rows(2), 2))
    # No ramp, but the new replica still enters at the current turn: shares alternate.
    got = serve(state, "least-loaded", 1000.0, 1, 100)
    assert got == {"chat/0": 50, "chat/1": 50}
