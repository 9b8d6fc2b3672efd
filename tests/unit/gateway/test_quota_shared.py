"""A limit shared by several gateways through the control plane's account
(gateway.stages.quota with ``shared=True``, catalog.forms.allowance): the overshoot bound
docs/operator/tenants.md states, held over any run of requests, draws, failed calls and
a gateway killed; and what a gateway does through an outage.

The gateways' calls are played in process: a call gives back and grants on one
``Account``, as the control plane's transaction does (events.write.allowances).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.forms.allowance import CHUNK_SHARE, TOKENS, Account, Granted
from catalog.forms.client_limits import ClientLimits
from gateway.stages.admission import Refusal
from gateway.stages.quota import Quotas, Ticket


@dataclass
class Cluster:
    """G gateways sharing one client's ``tpm`` account of ``size``."""

    size: int
    gateways: list[Quotas]
    account: Account
    now: float = 0.0
    served: int = 0
    # Per gateway: requests admitted and not settled (reservation, what it will use).
    inflight: list[list[tuple[Ticket, int]]] = field(default_factory=list)
    alive: list[bool] = field(default_factory=list)
    largest: int = 0

    @classmethod
    def of(cls, size: int, gateways: int) -> Cluster:
        return cls(
            size,
            [Quotas(shared=True, gateway=f"gw-{g}") for g in range(gateways)],
            Account.new(size, None, 0.0),
            inflight=[[] for _ in range(gateways)],
            alive=[True] * gateways,
        )

    @property
    def limits(self) -> ClientLimits:
        return ClientLimits(tpm=self.size)

    def call(self, g: int, dt: float, *, answered: bool = True) -> None:
        """Gateway g's allowance client makes one call (``answered``: it reaches the
        control plane)."""
        q = self.gateways[g]
        draws = q.draws(self.now, dt)
        if not answered:
            q.unrenewed("connection refused")
            return
        out = []
        for d in draws:
            # (As the control plane takes it: no more than this gateway was granted and
            # did not give back. An honest gateway never gives back more: taken whole.)
            taken = self.account.take_back(d.gateway, d.give_back, self.now)
            assert taken == d.give_back, (d.gateway, d.give_back, taken)
            granted = self.account.grant(d.want, self.now)
            self.account.hold(d.gateway, granted, self.now)
            credit, contested = self.account.lend(d.gateway, d.credit, d.reserve, self.now)
            out.append(
                Granted(
                    d.client, d.kind, granted, self.account.left(), self.size, credit, contested
                )
            )
        q.granted(out, self.now)

    def request(self, g: int, reserve: int, use: int) -> bool:
        # (Asked for, admitted or not: a gateway sizes the credit it asks for by it.)
        self.largest = max(self.largest, reserve)
        try:
            ticket = self.gateways[g].admit(
                "app", self.limits, "chat", reserve, prompt=1, now=self.now
            )
        except Refusal:
            return False
        self.inflight[g].append((ticket, use))
        return True

    def settle(self, g: int) -> None:
        if self.inflight[g]:
            ticket, use = self.inflight[g].pop(0)
            self.gateways[g].settle(ticket, use, self.now)
            self.served += use

    def kill(self, g: int) -> None:
        """SIGKILL: what it held is lost; its requests in flight were served whole."""
        self.served += sum(r.reserved for r, _ in self.inflight[g])
        self.inflight[g] = []
        self.alive[g] = False


# (gateway, kind of step, seconds passed, reservation, share of it used)
STEP = st.tuples(
    st.integers(0, 3),
    st.sampled_from(["request", "request", "request", "settle", "call", "fail", "kill"]),
    st.floats(0, 2.0),
    st.integers(1, 400),
    st.floats(0, 1),
)


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(100, 20_000),
    gateways=st.integers(1, 4),
    steps=st.lists(STEP, max_size=200),
)
def test_what_every_gateway_together_admits_is_bounded_by_the_chunks_outstanding(
    size: int, gateways: int, steps: list[tuple[int, str, float, int, float]]
) -> None:
    """Over a run that starts with the account full, what all gateways admitted (the
    engines' usage, a killed gateway's requests counted whole) is at most what one bucket
    allows, size * (1 + T/60), plus G * 5% of the limit, plus ONE request's reservation
    whatever the number of gateways: the account's credit is lent to one at a time."""
    c = Cluster.of(size, gateways)
    for which, kind, dt, reserve, share in steps:
        g = which % gateways
        c.now += dt
        if not c.alive[g]:
            continue
        if kind == "request":
            c.request(g, reserve, math.floor(reserve * share))
        elif kind == "settle":
            c.settle(g)
        elif kind in ("call", "fail"):
            c.call(g, dt, answered=kind == "call")
        elif kind == "kill" and sum(c.alive) > 1:
            c.kill(g)
        owed = 0.0
        for q, alive in zip(c.gateways, c.alive, strict=True):
            h = q.holdings.get(("app", TOKENS))
            if alive and h is not None:
                # A holding never above its cap, never owing more than one request.
                assert h.held <= CHUNK_SHARE * size + 1e-6
                assert h.held >= -c.largest - 1e-6
                owed += max(0.0, -h.held)
        # Every gateway together owes at most one request.
        assert owed <= c.largest + 1e-6
    for g in range(gateways):
        while c.alive[g] and c.inflight[g]:
            c.settle(g)
    bound = size * (1 + c.now / 60) + gateways * CHUNK_SHARE * size + c.largest
    assert c.served <= bound


def test_one_request_on_credit_whatever_the_number_of_gateways() -> None:
    """Requests larger than any holding (900 of a 1,000 limit) go on credit. Two gateways
    whose last answer showed the account with room both did, while a third drained it:
    each owed a request, and together they served 2,700 of a 1,000 limit. The account's
    credit is lent to one gateway at a time: the other is refused, and what they serve
    stays within one bucket, the chunks and ONE request's reservation."""
    c = Cluster.of(1000, 3)
    for g in (0, 1):  # each draws its chunk, and sees the account with room
        c.request(g, 10, 10)
        c.settle(g)
        c.call(g, 0.0)
    for _ in range(100):  # the third drains the account (no time passes: no refill)
        if c.request(2, 50, 50):
            c.settle(2)
        c.call(2, 0.0)
    assert c.account.left() == 0
    admitted = [c.request(g, 900, 900) for g in (0, 1)]
    assert admitted.count(True) <= 1
    for g in range(3):
        while c.inflight[g]:
            c.settle(g)
    assert c.served <= 1000 + 3 * CHUNK_SHARE * 1000 + 900


def test_two_gateways_together_serve_one_limit_not_two() -> None:
    """Two gateways, each asked as fast as it answers: together about the limit, where
    each counting on its own would serve it twice."""
    size = 6000
    c = Cluster.of(size, 2)
    admitted = 0
    for step in range(600):  # 60 s in steps of 0.1 s
        c.now = step * 0.1
        for g in (0, 1):
            c.call(g, 0.1)
            while c.request(g, 60, 50):
                admitted += 1
                c.settle(g)
    bound = size * (1 + c.now / 60) + 2 * CHUNK_SHARE * size + 60
    assert c.served <= bound
    assert c.served >= size * (1 + c.now / 60) * 0.9  # and the limit is there to use


def test_through_an_outage_a_gateway_serves_what_it_holds_then_refuses_503() -> None:
    c = Cluster.of(60_000, 1)
    c.request(0, 100, 100)
    c.settle(0)
    c.call(0, 0.2)  # drew its chunk
    q = c.gateways[0]
    held = q.holdings[("app", TOKENS)].held
    assert 0 < held <= CHUNK_SHARE * 60_000
    c.call(0, 0.2, answered=False)  # the control plane is gone
    served = 0
    with pytest.raises(Refusal) as refused:
        for _ in range(10_000):
            c.now += 0.01
            q.admit("app", c.limits, "chat", 100, prompt=1, now=c.now)
            served += 100
    assert served <= held
    r = refused.value
    assert (r.status, r.code) == (503, "allowance_not_renewed")
    assert "could not be renewed" in r.message and "connection refused" in r.message
    assert r.retry_after is not None and r.retry_after >= 1
    # The control plane back: the next call renews, and requests are admitted again.
    c.call(0, 0.2)
    q.admit("app", c.limits, "chat", 100, prompt=1, now=c.now)


def test_what_a_gateway_does_not_use_goes_back_to_the_account() -> None:
    c = Cluster.of(6000, 1)
    for _ in range(20):
        c.request(0, 60, 60)
        c.settle(0)
        c.call(0, 0.2)
    held = c.gateways[0].holdings[("app", TOKENS)].held
    assert held > 0
    before = c.account.left()
    c.now += 31  # idle: given back but one request's worth (its next needs no credit)
    c.call(0, 31)
    assert c.gateways[0].holdings[("app", TOKENS)].held == 60
    assert c.account.left() >= min(6000, before + held - 60)


def test_a_lowered_limit_stops_what_the_gateway_held_under_the_old_one() -> None:
    """`token limits app --tpm 100` on a client cut down (a leaked key): what the gateway
    drew under the old limit goes back, and it serves at most one more request on credit
    before the new limit's account says no; the old holding is never spent."""
    c = Cluster.of(60_000, 1)
    for _ in range(5):
        c.request(0, 100, 100)
        c.settle(0)
        c.call(0, 0.2)
    assert c.gateways[0].holdings[("app", TOKENS)].held >= 1000
    c.size = 100
    c.account.resize(100, None, c.now)
    admitted = 0
    for _ in range(50):
        c.now += 0.01
        if c.request(0, 100, 100):
            admitted += 1
            c.settle(0)
    assert admitted <= 1
    c.call(0, 0.2)  # the excess reaches the account
    assert c.account.left() <= 100


def test_a_gateway_runs_on_credit_only_within_its_line_lowered_from_the_sending() -> None:
    """A request over what is held goes on credit only within the line the account lent;
    a line lowered (another gateway lacked credit) or returned (idle) is so from the
    moment the call is planned, before the control plane may lend it elsewhere."""
    q = Quotas(shared=True, gateway="gw-a")
    limits = ClientLimits(tpm=1000)
    holding = ("app", TOKENS)
    with pytest.raises(Refusal):  # nothing held, no line: refused, and asked for at once
        q.admit("app", limits, "chat", 900, prompt=1, now=0.0)
    (d,) = q.draws(0.0, 0.2)
    assert (d.want, d.credit, d.reserve, d.gateway) == (50, 900, 900, "gw-a")
    q.granted([Granted("app", TOKENS, 50, 950, 1000, 900, False)], 0.1)
    ticket = q.admit("app", limits, "chat", 900, prompt=1, now=1.0)  # on credit
    assert q.holdings[holding].held == -850
    q.settle(ticket, 900, 1.1)
    q.draws(1.2, 1.0)  # owes: the line renewed, never lowered below what is owed
    q.granted([Granted("app", TOKENS, 900, 0, 1000, 900, True)], 1.3)  # another asked
    (d,) = q.draws(2.5, 1.3)
    assert d.credit == 850 and q.holdings[holding].credit == 850  # lowered at once
    (d,) = q.draws(40.0, 37.5)  # idle: returned at once
    assert d.credit == 0 and q.holdings[holding].credit == 0
    with pytest.raises(Refusal):
        q.admit("app", limits, "chat", 900, prompt=1, now=40.1)


def test_far_from_its_limit_a_busy_client_costs_a_call_per_half_cap_not_per_tick() -> None:
    """A client using a sliver of a large limit: its gateway tops the holding up once
    half of it is spent, not at every tick a request was served in (five calls a second
    for every active limited client, as much CPU as serving them); near the limit every
    round trip counts again."""
    c = Cluster.of(6_000_000, 1)  # holding: 5% = 300,000 tokens
    c.gateways[0].prepare([("app", c.limits)], c.now)  # (the token seen in the feed)
    c.call(0, 0.2)  # the first chunk
    calls = 0
    for _ in range(100):  # 20 s of ticks, a request of 100 tokens in each
        c.now += 0.2
        assert c.request(0, 100, 100)
        c.settle(0)
        if c.gateways[0].draws(c.now, 0.2):
            calls += 1
    # (One: the credit line lent before the first request goes back once requests are
    # seen to fit in what is held.)
    assert calls <= 1, f"{calls} calls for 10,000 tokens of a 300,000-token holding"

    # Near the limit (the account under half full): topped up as soon as a request's
    # worth is missing, as before.
    near = Cluster.of(6000, 1)
    near.gateways[0].prepare([("app", near.limits)], near.now)
    near.call(0, 0.2)
    near.account.grant(4000, near.now)  # other gateways took most of the minute
    near.call(0, 0.2)  # its answer: the account is no longer plenty
    for _ in range(2):
        assert near.request(0, 100, 100)
        near.settle(0)
    holding = near.gateways[0].holdings[("app", TOKENS)]
    assert any(d.want for d in near.gateways[0].draws(near.now, 0.2)), vars(holding)
