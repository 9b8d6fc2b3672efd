"""A shared allowance's account rules and its wire form (catalog.forms.allowance): a
bucket refills at its limit a minute and never above it, a budget counts its period in
slots and takes back what was not used, a limit changed keeps what was used, and a call
is bounded and refused naming the field."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.forms.allowance import (
    CREDIT_LEASE_S,
    MAX_DRAWS,
    MAX_LINES,
    Account,
    AllowanceError,
    parse_draws,
    parse_granted,
)


def test_a_bucket_grants_what_it_has_and_refills_at_its_limit_a_minute() -> None:
    a = Account.new(600, None, 0.0)
    assert a.grant(500, 0.0) == 500
    assert a.grant(500, 0.0) == 100  # what it has, not what was asked
    assert a.grant(10, 0.5) == 5  # 10 a second come back
    a.give_back(1000, 1.0)
    assert a.left() == 600  # never above the limit


def test_a_budget_counts_its_period_and_takes_back_what_was_not_used() -> None:
    day = 86_400
    a = Account.new(1000, day, 0.0)
    assert a.grant(800, 10.0) == 800
    assert a.grant(800, 20.0) == 200
    a.give_back(300, 30.0)
    assert a.grant(1000, 40.0) == 300
    assert a.grant(1, 0.9 * day) == 0  # still within the period
    assert a.grant(1000, 2 * day) == 1000  # the period has passed


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["grant", "back"]), st.integers(0, 500), st.floats(0, 30)),
        max_size=60,
    )
)
def test_a_bucket_never_grants_more_than_its_size_plus_its_refill(
    steps: list[tuple[str, int, float]],
) -> None:
    a, now, granted, back = Account.new(1000, None, 0.0), 0.0, 0, 0
    for kind, amount, dt in steps:
        now += dt
        if kind == "grant":
            granted += a.grant(amount, now)
        else:
            given_back = min(amount, granted - back)
            a.give_back(given_back, now)
            back += given_back
        assert 0 <= a.level <= 1000
    assert granted - back <= 1000 + 1000 * now / 60 + 1e-6


def test_a_changed_limit_keeps_what_was_used() -> None:
    a = Account.new(1000, None, 0.0)
    a.grant(400, 0.0)
    a.resize(2000, None, 0.0)
    assert a.left() == 1600


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ([], '{"draws": [...]}'),
        ({"draws": [], "more": 1}, "nothing else"),
        ({"draws": [{"client": "a", "kind": "tokens", "want": -1}]}, "draws[0].want"),
        ({"draws": [{"client": "a", "kind": "tokens", "want": True}]}, "draws[0].want"),
        ({"draws": [{"client": "", "kind": "tokens"}]}, "draws[0].client"),
        ({"draws": [{"client": "a\x00", "kind": "tokens"}]}, "printable"),
        ({"draws": [{"client": "a" * 65, "kind": "tokens"}]}, "1 to 64"),
        ({"draws": [{"client": "a", "kind": "tokens", "why": 1}]}, "unknown field(s) 'why'"),
        ({"draws": [{"client": "a", "kind": "t"}] * (MAX_DRAWS + 1)}, "at most"),
    ],
)
def test_a_call_is_bounded_and_a_refusal_names_the_field(body: object, says: str) -> None:
    with pytest.raises(AllowanceError, match=None) as refused:
        parse_draws(body)
    assert says in str(refused.value)


def test_the_answer_is_read_back_as_written() -> None:
    draws = parse_draws({"draws": [{"client": "a", "kind": "tokens:chat", "want": 5}]})
    assert (draws[0].want, draws[0].give_back) == (5, 0)
    answers = parse_granted(
        {"draws": [{"client": "a", "kind": "tokens", "granted": 5, "left": 9, "size": None}]}
    )
    assert answers[0].size is None and answers[0].granted == 5


def test_the_credit_lent_is_at_most_one_request_and_a_lapsed_lease_is_charged() -> None:
    """Every gateway's line together is at most the pool: the largest reservation a
    gateway said its requests make."""
    a = Account.new(1000, None, 0.0)
    assert a.lend("gw-a", 300, 300, 0.0) == (300, False)
    assert a.lend("gw-b", 200, 300, 1.0) == (0, False)  # the pool is lent: none
    assert a.lend("gw-a", 100, 300, 2.0) == (100, True)  # what it asks now; gw-b asked
    assert a.lend("gw-b", 250, 300, 2.5) == (200, True)  # what the pool has left
    assert a.lend("gw-a", 0, 300, 3.0) == (0, False)  # returned: nothing charged
    assert a.left() == 1000
    assert a.lend("gw-c", 250, 300, 4.0)[0] == 100
    assert a.lend("", 500, 500, 4.0) == (0, False)  # an older gateway borrows nothing
    # gw-b and gw-c are killed: their leases run out unrenewed, the account is charged
    # their lines (what they may owe) before the credit is lent again.
    later = 4.0 + CREDIT_LEASE_S
    assert a.lend("gw-a", 300, 300, later) == (300, False)
    assert a.left() == 700
    assert a.lend("gw-a", 5000, 5000, later)[0] == 1000  # never more than the limit


def test_before_any_request_is_known_the_credit_is_lent_whole_to_one_gateway() -> None:
    a = Account.new(1000, None, 0.0)
    assert a.lend("gw-a", 1000, 0, 0.0) == (1000, False)  # (it owes one request at most)
    assert a.lend("gw-b", 1000, 0, 0.0) == (0, False)
    assert a.lend("gw-b", 40, 51, 1.0) == (0, False)  # the pool is 51: none left yet
    assert a.lend("gw-a", 1, 51, 2.0) == (1, True)  # its line now within the pool
    assert a.lend("gw-b", 40, 51, 3.0) == (40, True)


def test_an_account_lends_to_at_most_max_lines_gateways_whatever_the_callers() -> None:
    # A gateway token naming a new gateway id on every call (a leaked one, a bug) must
    # not grow the account's row without end: past MAX_LINES lines, none for another
    # until one is returned or its lease lapses.
    a = Account.new(10**9, None, 0.0)
    got = [a.lend(f"gw-{i}", 1, 10**6, 0.0)[0] for i in range(MAX_LINES + 50)]
    assert got == [1] * MAX_LINES + [0] * 50 and len(a.lent) == MAX_LINES
    assert a.lend("gw-0", 0, 10**6, 1.0) == (0, False)  # one returned: room for one
    assert a.lend("gw-new", 1, 10**6, 1.0)[0] == 1 and len(a.lent) == MAX_LINES
    later = 1.0 + CREDIT_LEASE_S  # every lease lapsed: charged, lent afresh
    assert a.lend("gw-late", 1, 10**6, later)[0] == 1 and len(a.lent) == 1


def test_a_lapsed_credit_on_a_budget_counts_in_its_window() -> None:
    a = Account.new(1000, 3600, 0.0)
    a.lend("gw-a", 300, 300, 0.0)
    a.lend("gw-b", 300, 300, CREDIT_LEASE_S + 1)
    assert a.left() == 700 and sum(a.slots.values()) == 300
