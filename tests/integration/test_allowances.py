"""Client allowances' accounts on real SQLite and PostgreSQL databases migrated by Alembic
(events.write.allowances): a grant is atomic in the database, so gateways drawing at once
through two control-plane replicas (two engines, each its own connection pool) are never
granted the same tokens; what is given back can be granted again; a limit changed
resizes its account."""

from __future__ import annotations

import math
import threading

from sqlalchemy import Engine, update

from catalog.forms.allowance import BUDGET, MAX_AMOUNT, MAX_DRAWS, MAX_GATEWAY, TOKENS, Draw
from events.database.connection import make_engine
from events.database.tables import AllowanceRow
from events.write.allowances import Asked, exchange, read_accounts

PERIOD = 86_400


def _budget(want: int, give_back: int = 0, size: int = 1000) -> Asked:
    return Asked(Draw("app-1", BUDGET, want, give_back), size, PERIOD)


def test_concurrent_draws_through_two_replicas_never_grant_more_than_the_account(
    db_url: str, engine: Engine
) -> None:
    other = make_engine(db_url)  # a second control-plane replica on the same database
    granted: list[int] = []
    lock = threading.Lock()

    def gateway(replica: Engine) -> None:
        while True:
            answer = exchange(replica, [_budget(7)])[0]
            with lock:
                granted.append(answer.granted)
            if answer.granted == 0:
                return

    threads = [threading.Thread(target=gateway, args=(e,)) for e in [engine, other] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    other.dispose()
    # Every token of the budget granted once: none twice, none lost.
    assert sum(granted) == 1000
    assert exchange(engine, [_budget(1)])[0].granted == 0
    # What a gateway did not use goes back and is granted again.
    back = exchange(engine, [_budget(0, give_back=40)])[0]
    assert (back.granted, back.left) == (0, 40)
    assert exchange(engine, [_budget(50)])[0].granted == 40


def test_a_bucket_starts_full_grants_what_it_has_and_resizes_with_its_limit(
    engine: Engine,
) -> None:
    tokens = Draw("app-1", TOKENS, 600, 0)
    first = exchange(engine, [Asked(tokens, 1000)])[0]
    assert (first.granted, first.size) == (600, 1000)
    assert first.left <= 400 + 1  # (a moment's refill)
    second = exchange(engine, [Asked(tokens, 1000)])[0]
    assert second.granted < 600  # what was left, not another 600
    # The limit raised to 10,000: the new size less what the old one lacked.
    raised = exchange(engine, [Asked(Draw("app-1", TOKENS, 0, 0), 10_000)])[0]
    assert raised.size == 10_000 and 9000 - 1 <= raised.left <= 10_000
    stored = read_accounts(engine, "app-1")[("app-1", TOKENS)]
    assert stored.size == 10_000
    # A client or limit the control plane does not know: nothing, said with a null size.
    unknown = exchange(engine, [Asked(Draw("gone", TOKENS, 10, 0), None)])[0]
    assert (unknown.granted, unknown.size) == (0, None)


def test_an_accounts_credit_pool_is_kept_across_calls_and_replicas(
    db_url: str, engine: Engine
) -> None:
    """Kept in the row (its ``slots`` JSON): a second replica's call sees the pool lent,
    and a budget's slots stay what they were."""
    other = make_engine(db_url)
    try:
        for kind, period in ((TOKENS, None), (BUDGET, PERIOD)):
            ask = Asked(Draw("app-1", kind, 10, 0, 300, 300, "gw-a"), 1000, period)
            first = exchange(engine, [ask])[0]
            assert (first.granted, first.credit, first.contested) == (10, 300, False)
            b = exchange(other, [Asked(Draw("app-1", kind, 0, 0, 200, 300, "gw-b"), 1000, period)])
            assert (b[0].credit, b[0].contested) == (0, False)
            renewed = exchange(other, [ask])[0]
            assert (renewed.credit, renewed.contested) == (300, True)
            returned = Asked(Draw("app-1", kind, 0, 0, 0, 300, "gw-a"), 1000, period)
            assert exchange(engine, [returned])[0].credit == 0
            b = exchange(engine, [Asked(Draw("app-1", kind, 0, 0, 200, 300, "gw-b"), 1000, period)])
            assert b[0].credit == 200
            stored = read_accounts(engine, "app-1")[("app-1", kind)]
            assert stored.pool == 300 and list(stored.lent) == ["gw-b"]
            assert stored.lent["gw-b"][0] == 200
            assert sum(stored.slots.values()) == (20 if period else 0)
    finally:
        other.dispose()


HOSTILE_SLOTS = [
    "{" * 100_000,  # deeper than the parser goes: RecursionError, not ValueError
    "[" * 50_000 + "]" * 50_000,
    '{"credit": {"pool": 300, "wanted": 0, "lent": {"gw-x": [1e999, NaN]}}}',
    '{"credit": {"pool": 300, "wanted": Infinity, "lent": {}}}',
    '{"credit": {"pool": 300, "wanted": 0, "lent": {"gw-x": [' + "9" * 400 + ", 1]}}}",
    '{"credit": {"pool": -5, "wanted": 0, "lent": {}}}',
    '{"99999999999999999999999999": 5, "1": ' + "9" * 400 + "}",
    "x" * 2_000_000,
    "\x1b[2J\x07 not json",  # (PostgreSQL text holds no NUL)
    '{"held": {"gw-a": [NaN, 1], "gw-b": "x", "gw-c": [1e300, 1], "gw-d": [-5, 1]}}',
    '{"held": [1, 2]}',
    '{"held": {"' + "g" * 500 + '": [5, 1]}}',
]


def test_a_hostile_slots_text_is_read_around_never_an_error_of_the_call(
    db_url: str, engine: Engine
) -> None:
    """Whatever bytes a row's ``slots`` holds (deep, huge, NaN, infinities, numbers past a
    float), the call is answered from the rest of the row and the row is rewritten whole;
    a stuck line (a lease that never ends: NaN) is not kept."""
    ask = Asked(Draw("app-1", TOKENS, 10, 0, 300, 300, "gw-a"), 1000, None)
    for text in HOSTILE_SLOTS:
        exchange(engine, [ask])
        with engine.begin() as conn:
            conn.execute(update(AllowanceRow.__table__).values(slots=text))  # type: ignore[arg-type]
        answer = exchange(engine, [ask])[0]
        assert answer.size == 1000 and answer.credit in (0, 300), text[:60]
        stored = read_accounts(engine, "app-1")[("app-1", TOKENS)]
        assert all(math.isfinite(v) for line in stored.lent.values() for v in line), text[:60]
        assert 0 <= stored.pool <= 1000
        assert all(0 < line[0] <= MAX_AMOUNT for line in stored.held.values()), text[:60]
        assert all(len(g) <= MAX_GATEWAY for g in stored.held), text[:60]


def test_a_gateway_gives_back_no_more_than_it_was_granted(engine: Engine) -> None:
    """A hostile gateway token that gives back what it never drew must not mint tokens for
    the other gateways (docs/operator/tenants.md's bound: granted less given back): a
    gateway's give-back is taken at most up to what its own id was granted and has not
    given back, whatever it says."""
    slack = 20  # (a bucket's refill, 1000 a minute, over a loaded second)
    for kind, period in ((BUDGET, PERIOD), (TOKENS, None)):
        honest = Asked(Draw("app-1", kind, 1000, 0, gateway="gw-honest"), 1000, period)
        assert exchange(engine, [honest])[0].granted == 1000  # the account spent
        # A gateway that drew nothing gives back the whole limit, twice, and under no id.
        for gateway in ("gw-evil", "gw-evil", ""):
            evil = Asked(Draw("app-1", kind, 0, 1000, gateway=gateway), 1000, period)
            assert exchange(engine, [evil])[0].left <= slack, (kind, gateway)
        again = exchange(engine, [honest])[0]
        assert again.granted <= slack, kind
        # It draws 10 (what the bucket refilled) and gives back 1000: what it drew goes
        # back, no more.
        evil = Asked(Draw("app-1", kind, 10, 0, gateway="gw-evil"), 1000, period)
        drew = exchange(engine, [evil])[0].granted
        assert drew <= slack
        evil = Asked(Draw("app-1", kind, 0, 1000, gateway="gw-evil"), 1000, period)
        assert exchange(engine, [evil])[0].left <= drew + slack, kind
        # The honest gateway's own give-back is taken whole.
        back = exchange(
            engine, [Asked(Draw("app-1", kind, 0, 600, gateway="gw-honest"), 1000, period)]
        )[0]
        assert 600 <= back.left <= 600 + drew + 2 * slack, kind


def test_a_call_of_the_most_draws_for_as_many_accounts_is_answered(engine: Engine) -> None:
    """``MAX_DRAWS`` draws for as many accounts (a gateway that learns that many limited
    tokens at once draws for each in one call): answered. On PostgreSQL the accounts were
    made in one statement of 70,000 bound parameters, past its 65,535: every such call
    failed, and the gateway's next one the same."""
    asked = [Asked(Draw(f"app-{i}", TOKENS, 1, 0, gateway="gw"), 1000) for i in range(MAX_DRAWS)]
    answers = exchange(engine, asked)
    assert [a.client for a in answers] == [a.draw.client for a in asked]
    assert all((a.granted, a.size) == (1, 1000) for a in answers)
    assert len(read_accounts(engine)) == MAX_DRAWS
