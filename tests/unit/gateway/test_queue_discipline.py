"""The queue's discipline as data (gateway.stages.queue): class order, weighted fair
shares over tokens served, no starvation past the stated bound, the length bound, and a
request's class lowered but never raised."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.forms.priority import BATCH, CRITICAL, STANDARD
from gateway.stages.queue import (
    CLASSES,
    RANK,
    Bounds,
    ModelQueue,
    Waiter,
    lowered,
)

FAR = 1e9  # a deadline never reached in these tests


def waiter(client: str, klass: str = STANDARD, share: float = 1.0, at: float = 0.0) -> Waiter:
    return Waiter(client, klass, share, at, FAR)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(CLASSES), min_size=1, max_size=40))
def test_a_higher_class_always_leaves_first_within_the_starvation_bound(
    classes: list[str],
) -> None:
    q = ModelQueue("m", Bounds(starvation_s=30.0))
    for i, klass in enumerate(classes):
        assert q.push(waiter(f"c{i % 3}", klass))[0]
    out = []
    while (w := q.pop(now=1.0)) is not None:
        out.append(RANK[w.klass])
    assert out == sorted(out)
    assert q.length == 0


@settings(max_examples=100, deadline=None)
@given(
    shares=st.lists(st.integers(1, 5), min_size=2, max_size=4),
    tokens=st.lists(st.integers(1, 400), min_size=2, max_size=4),
)
def test_backlogged_clients_are_served_tokens_in_proportion_to_their_shares(
    shares: list[int], tokens: list[int]
) -> None:
    """Every client always has a request waiting; each request of client i is served
    ``tokens[i]`` tokens (clients of long and of short answers alike). Over many
    dispatches each client's tokens / share stays within one request's worth (plus the
    first guess) of every other's: WFQ's bound."""
    n = min(len(shares), len(tokens))
    q = ModelQueue("m")
    served = Counter[str]()
    for i in range(n):
        q.push(waiter(f"c{i}", share=shares[i]))
    for _ in range(600):
        w = q.pop(now=0.0)
        assert w is not None
        i = int(w.client[1:])
        served[w.client] += tokens[i]
        q.served(w, tokens[i])
        q.push(waiter(w.client, share=shares[i]))  # still backlogged
    normalised = [served[f"c{i}"] / shares[i] for i in range(n)]
    slack = max(tokens[i] / shares[i] for i in range(n)) + 64
    assert max(normalised) - min(normalised) <= 2 * slack


def test_a_client_of_long_answers_gets_fewer_requests_than_one_of_short_answers() -> None:
    q = ModelQueue("m")
    q.push(waiter("long"))
    q.push(waiter("short"))
    picks = Counter[str]()
    for _ in range(200):
        w = q.pop(now=0.0)
        assert w is not None
        picks[w.client] += 1
        q.served(w, 500 if w.client == "long" else 50)
        q.push(waiter(w.client))
    assert picks["short"] > 5 * picks["long"]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 50), st.floats(1.0, 100.0))
def test_a_batch_request_waiting_past_the_bound_goes_before_any_newer_critical_one(
    critical: int, bound: float
) -> None:
    q = ModelQueue("m", Bounds(starvation_s=bound))
    q.push(waiter("batchy", BATCH, at=0.0))
    for i in range(critical):
        q.push(waiter(f"crit{i}", CRITICAL, at=1.0))
    # Before the bound, critical ones first; at the bound, the batch request.
    if critical:
        early = q.pop(now=bound - 0.5)
        assert early is not None and early.klass == CRITICAL
    late = q.pop(now=bound)
    assert late is not None and late.client == "batchy"


def test_the_length_bound_refuses_an_equal_class_and_a_higher_one_displaces_the_newest_lowest() -> (
    None
):
    q = ModelQueue("m", Bounds(max_length=3))
    first, second = waiter("a", BATCH), waiter("b", BATCH)
    assert q.push(first) == (True, None)
    assert q.push(second) == (True, None)
    assert q.push(waiter("c", STANDARD)) == (True, None)
    assert q.push(waiter("x", BATCH)) == (False, None)  # full of its class and above
    ok, evicted = q.push(waiter("e", CRITICAL))
    assert ok and evicted is second  # the newest of the lowest class
    assert q.length == 3
    assert q.push(waiter("f", STANDARD))[1] is first
    assert q.push(waiter("g", STANDARD)) == (False, None)
    assert [w.client for w in iter(lambda: q.pop(0.0), None)] == ["e", "c", "f"]


def test_a_client_back_from_idle_starts_at_the_clock_not_with_credit() -> None:
    q = ModelQueue("m")
    q.push(waiter("busy"))
    for _ in range(50):
        w = q.pop(0.0)
        assert w is not None
        q.served(w, 100)
        q.push(waiter("busy"))
    q.push(waiter("newcomer"))
    picks = Counter[str]()
    for _ in range(20):
        w = q.pop(0.0)
        assert w is not None
        picks[w.client] += 1
        q.served(w, 100)
        q.push(waiter(w.client))
    # Alternating, not twenty newcomers in a row on 50 requests' worth of credit.
    assert 8 <= picks["newcomer"] <= 12


def test_the_snapshot_shows_length_oldest_wait_per_class_and_per_client() -> None:
    q = ModelQueue("m")
    q.push(waiter("a", BATCH, at=1.0))
    q.push(waiter("a", BATCH, at=2.0))
    q.push(waiter("b", CRITICAL, at=4.0))
    snap = q.snapshot(now=5.0)
    assert snap["length"] == 3
    assert snap["oldest_wait_s"] == 4.0
    assert snap["classes"][BATCH] == {"length": 2, "oldest_wait_s": 4.0}
    assert snap["classes"][CRITICAL] == {"length": 1, "oldest_wait_s": 1.0}
    assert snap["clients"]["a"] == {"length": 2, "oldest_wait_s": 4.0}


@given(st.sampled_from(CLASSES), st.one_of(st.none(), st.sampled_from([*CLASSES, "root", ""])))
def test_a_request_may_lower_its_class_never_raise_it(own: str, asked: str | None) -> None:
    got = lowered(own, asked)
    assert RANK[got] >= RANK[own]
    assert got == (asked if asked in RANK and RANK[asked] >= RANK[own] else own)


def test_one_client_filling_the_queue_does_not_shut_the_others_of_its_class_out() -> None:
    # A tenant with many requests in flight filled a full model's queue with its own
    # (standard) waiters, and every other standard client was refused 429 queue_full at
    # once, though the fair order would have served it next: the length bound let one
    # client take every place. A newcomer of a client with fewer waiters now takes the
    # place of the newest waiter of the client with the most (at least two more).
    q = ModelQueue("m", Bounds(max_length=4))
    flood = [waiter("mallory") for _ in range(4)]
    for w in flood:
        assert q.push(w) == (True, None)
    ok, evicted = q.push(waiter("alice"))
    assert ok and evicted is flood[-1]
    ok, evicted = q.push(waiter("bob"))
    assert ok and evicted is flood[-2]
    # Mallory's 2 are still two more than carol's none: carol takes the newest.
    ok, evicted = q.push(waiter("carol"))
    assert ok and evicted is flood[-3]
    # Now one each: a fourth client is refused, as before the bound was shared.
    assert q.push(waiter("dave")) == (False, None)
    # The flooding client itself never displaces its own, nor a lower class's rule.
    assert q.push(waiter("mallory")) == (False, None)
    assert q.length == 4
    # The fair order is unchanged: each client's first waiter, by virtual time.
    assert sorted(w.client for w in iter(lambda: q.pop(0.0), None)) == [
        "alice",
        "bob",
        "carol",
        "mallory",
    ]
