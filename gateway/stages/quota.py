"""A client token's limits at admission: reserve before sending, settle to the engine's usage.

Pure: the clock is passed in. One ``Quotas`` per gateway process holds, per client
token, what its limits count (catalog.forms.client_limits):

- ``rpm`` and ``tpm`` (every model together, and one model's own ``model_tpm``) are
  token buckets, OpenAI's rule: a bucket holds up to a minute's limit and refills
  continuously at the limit per minute. A request takes one request and its
  reservation's tokens; it is admitted only if the whole reservation is there, so
  what a client is served in any minute is at most its limit (plus what the engine
  served beyond the reservation, which the next requests then wait for).
- ``max_inflight``: requests admitted and not yet finished.
- ``budget``: tokens over a rolling period, counted in ``BUDGET_SLOTS`` slots of
  the period; a slot's tokens leave the window when the whole slot has (so the window
  is at least the period: never generous).

A request reserves its prompt tokens (as admission counted them, else its conservative
estimate) plus its completion bound (``max_tokens``, else the model's ``max_output``,
else the model's window left after the prompt, else ``DEFAULT_COMPLETION``), and
settles to the engine's own ``usage`` when it ends: the reservation is given back and
what was used is taken (a request that sent nothing uses nothing).

Over a limit: ``Refusal`` 429, OpenAI's error shape, ``code`` naming the limit
(``rate_limit_requests``, ``rate_limit_tokens``, ``max_inflight``,
``budget_exhausted``) and ``retry_after`` when it will fit again. ``headers`` gives
OpenAI's ``x-ratelimit-*`` headers for every answer of a limited token.

Alone (``Quotas()``, no control plane to share with), each process counts a whole
limit; with ``llmgw gateway --workers N`` each worker is a ``Quotas(share=N)`` and holds
1/N of every limit (rounded down, at least 1).

**Shared** (``Quotas(shared=True)``, what ``llmgw gateway`` runs): the rate limits and the
budget are accounts of the control plane, shared by every gateway
(catalog.forms.allowance). This process holds a ``Holding`` of each, drawn in chunks by
the allowance client (gateway.allowance) off the request path, and a request spends from
what is held here: it never waits on the control plane. The bound on what every gateway
together admits, for one limit of L a minute (a budget: L over its period):

- a grant leaves the account when it is made, and the account is the single bucket the
  limit describes, so over any interval of T seconds what the gateways are granted, less
  what they give back, is at most L + L*T/60 (the bucket full at the start, plus its
  refill), exactly as for one gateway;
- what they admit is what they were granted plus what they held when the interval
  began, less what they hold at its end. A gateway holds at most ``cap`` = 5% of L
  (``CHUNK_SHARE``; its N workers 1/N of that each). A request is admitted when what is
  held covers its reservation, or, on credit, when nothing is owed, the account had room
  for it at its last answer and what it lacks is within the line of the account's credit
  this process holds (``Holding.lend``, ``Account.lend``): every line together is at
  most one request's reservation R (the largest one asked for), a line lowered or
  returned is so from the sending of the call, and a line whose lease lapsed is charged
  to the account. So at any instant every gateway together owes at most R;
- so with G gateways what a client is admitted over any interval is at most what one
  gateway alone would admit plus G * 5% of L plus R: with two gateways, 10% of L plus
  one request's reservation. A killed gateway's holding is lost (the client is then
  granted less, never more), and through a control-plane outage a gateway serves within
  what it holds and then refuses with 503 ``allowance_not_renewed``. ``max_inflight`` is
  not shared: each process counts its own (1/N of it with N workers).

What the engine serves beyond a request's reservation (the prompt's estimate was low)
comes out of the holding as it does out of a single gateway's bucket.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from catalog.forms.allowance import (
    BUDGET,
    CHUNK_SHARE,
    CREDIT_TRUST_S,
    MAX_AMOUNT,
    MODEL_PREFIX,
    REQUESTS,
    TOKENS,
    Draw,
    kinds,
)
from catalog.forms.allowance import Granted as Answer
from catalog.forms.client_limits import ClientLimits
from gateway.stages.admission import (
    EMBEDDINGS,
    Refusal,
    Request,
    Window,
    estimate,
)
from gateway.stages.head import pairs
from gateway.table import ModelEntry

# What a request reserves for its completion when it gives no max_tokens and neither
# the model's max_output nor its context window is known.
DEFAULT_COMPLETION = 4096
# A budget's period is counted in this many slots.
BUDGET_SLOTS = 60
# The longest Retry-After (seconds): the SDKs honour at most 60 and back off on their
# own beyond it; a budget's wait is said in the message too.
MAX_RETRY_AFTER_S = 60
MINUTE = 60.0
# A holding covers this many seconds of the client's recent rate here (drawn ahead).
AHEAD_S = 2.0
# The recent rate's time constant.
RATE_TAU_S = 2.0
# While the account has more than this share of its limit left, a holding is the whole
# cap: the client is far from its limit, and what is held cannot raise the bound.
PLENTY = 0.5
# A holding idle this long is given back whole (its client's next request is on credit).
IDLE_S = 30.0
# How long a refusal for an allowance the control plane did not renew says to wait.
UNRENEWED_RETRY_S = 5
# A credit held is renewed by a call at least this often (its holder trusts it for
# CREDIT_TRUST_S after the call that renewed it was sent).
CREDIT_RENEW_S = 1.0
# (client, model) plans kept (``Quotas._plan``); past it they are all made again.
MAX_PLANS = 4096


@dataclass(slots=True)
class Bucket:
    """A token bucket of ``size`` refilled at ``size`` a minute, full at the start."""

    size: int
    level: float
    at: float

    def refill(self, now: float) -> float:
        if now > self.at:
            self.level = min(self.size, self.level + (now - self.at) * self.size / MINUTE)
            self.at = now
        return self.level

    def wait_s(self, amount: float) -> float:
        """Seconds until ``amount`` is there (after ``refill``)."""
        return max(0.0, (amount - self.level) * MINUTE / self.size)

    def reset_s(self) -> float:
        """Seconds until full again (OpenAI's ``x-ratelimit-reset-*``)."""
        return max(0.0, (self.size - self.level) * MINUTE / self.size)


@dataclass(slots=True)
class Budget:
    """Tokens over the last ``period_s``, in ``BUDGET_SLOTS`` slots."""

    size: int
    period_s: int
    # Slot -> tokens, oldest first (slots are made in time order).
    slots: dict[int, int] = field(default_factory=dict)
    total: int = 0
    # The slot ``expire`` last ran in: within one slot nothing can leave the window.
    checked: int = -1

    def _slot(self, now: float) -> int:
        return int(now * BUDGET_SLOTS // self.period_s)

    def expire(self, now: float) -> None:
        current = self._slot(now)
        if current == self.checked:
            return
        self.checked = current
        oldest = current - BUDGET_SLOTS
        for slot in [s for s in self.slots if s <= oldest]:
            self.total -= self.slots.pop(slot)

    def add(self, tokens: int, now: float, slot: int | None = None) -> int:
        """Count ``tokens`` in ``slot`` (now's when None, or when that slot has left the
        window: a settlement after it counts from now); the slot counted in."""
        if slot is None or slot not in self.slots:
            slot = self._slot(now)
        self.slots[slot] = self.slots.get(slot, 0) + tokens
        self.total += tokens
        return slot

    def wait_s(self, amount: int, now: float) -> float:
        """Seconds until the oldest slots leave enough room for ``amount``."""
        need = self.total + amount - self.size
        width = self.period_s / BUDGET_SLOTS
        for slot in sorted(self.slots):
            need -= self.slots[slot]
            if need <= 0:
                return max(0.0, (slot + BUDGET_SLOTS + 1) * width - now)
        return float(self.period_s)


@dataclass(slots=True)
class Use:
    """What one client token's limits count. Rebuilt (empty) when its limits change
    size; a change that keeps a bucket's size keeps its level."""

    limits: ClientLimits
    requests: Bucket | None = None
    tokens: Bucket | None = None
    models: dict[str, Bucket] = field(default_factory=dict)
    inflight: int = 0
    budget: Budget | None = None
    # The x-ratelimit-* headers' buckets and names (``_shown``), made once.
    shown: tuple[tuple[Bucket, bytes, bytes, tuple[bytes, bytes]], ...] | None = None
    shown_model: str | None = None


@dataclass(slots=True)
class Holding:
    """What this process holds of one shared limit's account (``Quotas(shared=True)``).

    ``held`` is spent by requests and refunded at their settlement (negative: owed, the
    next grant pays it first); what a refund brings above ``cap`` is given back. The
    allowance client sets ``target`` from the recent rate and draws when ``held`` falls
    below ``low``."""

    size: int
    cap: float
    held: float = 0.0
    # Above the cap (refunds): given back at the next draw.
    give: float = 0.0
    # Asked for here, all told, admitted or refused (the allowance client takes the
    # recent rate from it), the largest single reservation and when one was last asked
    # (monotonic).
    used: float = 0.0
    largest: float = 0.0
    last: float = -math.inf
    # The account's units left at its last answer (None: never answered here), when
    # (monotonic), and whether it refills (a bucket; a budget does not).
    left: int | None = None
    left_at: float = 0.0
    refills: bool = True
    # The allowance client's: the recent rate (units/s), what to hold, when to draw.
    rate: float = 0.0
    counted: float = 0.0
    target: float = 0.0
    low: float = 0.0
    # A request refused for want of this holding (its reservation): asked for at once.
    short: float = 0.0
    # The account's credit (catalog.forms.allowance): the line this process holds (0:
    # none), until when it uses it (monotonic), whether another gateway asked for it,
    # and when the last call that asked for it or renewed it was planned (sent just after).
    credit: int = 0
    credit_until: float = -math.inf
    contested: bool = False
    credit_sent: float = -math.inf
    # The line asked for in the call being made (None: the call has no word of it), and
    # what the last request refused lacked of what was held.
    credit_asked: int | None = None
    lacked: float = 0.0

    def plan(self, now: float, dt: float) -> None:
        """The recent rate over ``dt`` seconds, and the target held from it."""
        if dt > 0:
            weight = math.exp(-dt / RATE_TAU_S)
            self.rate = self.rate * weight + (self.used - self.counted) / dt * (1 - weight)
        self.counted = self.used
        plenty = False
        if now - self.last > IDLE_S:
            # Idle: one request's worth kept (the whole cap for a client not yet seen
            # here), so that its next request needs no credit.
            self.target = min(self.cap, self.largest or self.cap)
        elif self.left is None or self.left >= PLENTY * self.size:
            # (Never answered: a new account is full.)
            self.target = self.cap
            plenty = True
        else:
            self.target = min(self.cap, max(self.rate * AHEAD_S, 4 * self.largest))
        if plenty:
            # Far from the limit: topped up once half the cap is spent. Topping it up as
            # soon as a request's worth was missing made a call every tick (five a second)
            # for every active client, limited or all but unlimited, far from any
            # refusal: as much CPU in the allowance client as in serving, at a few dozen
            # requests a second (py-spy, bench.gateway --client-limits).
            self.low = self.target / 2
        else:
            # Near it: as soon as a request's worth is missing: a gateway can spend at
            # most its cap per round trip to the control plane, so every round trip
            # counts.
            self.low = max(self.target - self.largest, self.target / 2)

    def draw(self) -> tuple[int, int, bool]:
        """(want, give_back, ask) for the next call, ``ask`` when it must be made even
        for nothing (a request was refused: the account's ``left`` is asked afresh, so
        the next one may go on credit). What is given back leaves ``held`` now (a call
        that fails loses it: the client is granted less, never more)."""
        give = math.floor(self.give)
        self.give -= give
        if self.held > 2 * self.target or (self.target == 0 and self.held > 0):
            excess = math.floor(self.held - self.target)
            self.held -= excess
            give += excess
        goal = self.target
        ask = self.short > 0
        if ask:
            goal = max(goal, min(self.short, self.cap))
            self.short = 0.0
        want = 0
        if self.held < self.low or ((self.left is None or ask) and self.held < goal):
            want = math.ceil(goal - self.held)
        return want, give, ask

    def lend(self, now: float, short: float) -> tuple[int, int] | None:
        """(line, reserve) of credit to ask for, renew (a positive line) or return (0)
        in the next call; None: no word of it this call. ``reserve`` is the largest
        reservation seen (0: none yet; the account's pool grows to it); the line a
        whole request (all that can be lent while no request was seen), or, once
        another gateway lacked credit, only what a request may lack of what is held
        (its reservation over the target, or what the last refused one lacked), and
        never less than what is owed. Asked for ahead of need: when requests are
        larger than the target, before the client's first request here, or when one
        was refused for want of it; kept while the client uses this gateway and its
        requests are larger than the target; returned when they fit in it or the
        client is idle here, and never while anything is owed (the next grant pays it
        first). Returned or lowered: so from now on, whatever the call (raised: from
        its answer)."""
        reserve = min(self.size, math.ceil(max(self.largest, short)))
        owed = math.ceil(max(0.0, -self.held))
        if not reserve:
            need = self.size
        elif self.contested:
            need = min(reserve, max(1, math.ceil(max(reserve - self.target, self.lacked))))
        else:
            need = reserve
        line = max(need, owed)
        self.lacked = 0.0
        active = now - self.last <= IDLE_S
        if self.credit:
            if owed or (active and not 0 < reserve <= self.target):
                if line == self.credit and now - self.credit_sent < CREDIT_RENEW_S:
                    return None
                return line, reserve
            self.credit, self.credit_until, self.contested = 0, -math.inf, False
            return 0, reserve
        if short > 0 or (active and reserve == 0) or (active and reserve > self.target):
            return line, reserve
        return None

    def account(self, now: float) -> float | None:
        """What the account has now, by its last answer and its refill since (others'
        draws since then unknown here); None: never answered."""
        if self.left is None:
            return None
        if not self.refills:
            return float(self.left)
        return min(float(self.size), self.left + (now - self.left_at) * self.size / MINUTE)

    def refund(self, amount: float) -> None:
        self.held += amount
        if self.held > self.cap:
            self.give += self.held - self.cap
            self.held = self.cap


@dataclass(slots=True)
class Ticket:
    """One admitted request's reservation, until it settles."""

    client: str
    model: str
    reserved: int
    # The prompt's share of ``reserved`` (what a request that ends without the engine's
    # usage is taken to have used, with the completion the gateway counted).
    prompt: int
    # The budget slot the reservation went into (where its settlement goes too).
    slot: int | None = None
    settled: bool = False
    # Shared: the token holdings the reservation was spent from (refunded at settlement).
    spent: tuple[Holding, ...] = ()


@dataclass(slots=True)
class _Plan:
    """What a request of one client to one model spends and shows, made once (a request
    looked its holdings up, built their keys and the headers' names each time: half the
    quota stage's cost). Made again when the client's limits change (another object) or
    a holding is made, resized or dropped (``Quotas._plans`` cleared)."""

    limits: ClientLimits
    # (holding, spends one request rather than the reservation's tokens, the limit's name)
    wanted: tuple[tuple[Holding, bool, str], ...]
    # The token holdings a reservation is spent from (refunded at settlement).
    spent: tuple[Holding, ...]
    # The x-ratelimit-* headers: (limit, holding or None, the three header lines with
    # the remaining count and the reset time left to fill in: one format a limit).
    shown: tuple[tuple[int, Holding | None, bytes], ...]


def reservation(
    req: Request, m: ModelEntry, prompt_tokens: int | None, w: Window
) -> tuple[int, int]:
    """The tokens a request reserves, and its prompt's share: its prompt (as admission
    counted it, else the estimate) plus its completion bound."""
    prompt = prompt_tokens if prompt_tokens is not None else estimate(req)
    if req.kind == EMBEDDINGS:
        return prompt, prompt
    if req.max_tokens is not None:
        completion = req.max_tokens
    elif m.max_output:
        completion = m.max_output
    elif w.tokens:
        completion = max(w.tokens - prompt, 1)
    else:
        completion = DEFAULT_COMPLETION
    return prompt + completion, prompt


def _retry(seconds: float) -> int:
    return min(max(1, math.ceil(seconds)), MAX_RETRY_AFTER_S)


class Quotas:
    """Every limited client token's counts in this gateway process."""

    def __init__(self, share: int = 1, *, shared: bool = False, gateway: str = "") -> None:
        self.uses: dict[str, Use] = {}
        # This process's id in its calls for allowances (unique among every gateway's
        # processes): the account's credit is lent to it by it. None (""): never lent.
        self.gateway = gateway
        # This process's share of each limit: 1/share of it (``--workers``).
        self.share = max(share, 1)
        # Shared with the other gateways through the control plane's accounts.
        self.shared = shared
        # (client, kind) -> what this process holds of that account.
        self.holdings: dict[tuple[str, str], Holding] = {}
        # (client, model) -> what its requests spend and show (``_plan``).
        self._plans: dict[tuple[str, str | None], _Plan] = {}
        # Whether the last call to the control plane for allowances answered, and why not.
        self.renewable = True
        self.renew_error = ""
        # The allowance client's wake-up: a holding fell below its low mark.
        self.wake: Callable[[], None] | None = None

    def use(self, client: str, limits: ClientLimits, now: float) -> Use:
        found = self.uses.get(client)
        if found is not None and found.limits is limits:
            return found
        if found is None or found.limits != limits:
            found = self._renew(found, limits, now, self.share)
            self.uses[client] = found
        else:
            # The same limits read again (every resync makes new objects): the next
            # look-up is an identity check again.
            found.limits = limits
        return found

    @staticmethod
    def _renew(old: Use | None, limits: ClientLimits, now: float, share: int) -> Use:
        """A client's counts under (new) limits: a bucket of the same size keeps its
        level, a new size starts full at its new size less what the old one lacked."""

        def part(size: int | None) -> int | None:
            return None if size is None else max(size // share, 1)

        def bucket(size: int | None, was: Bucket | None) -> Bucket | None:
            size = part(size)
            if size is None:
                return None
            if was is None:
                return Bucket(size, float(size), now)
            was.refill(now)
            lacking = was.size - was.level
            return Bucket(size, size - lacking, now)

        use = Use(limits)
        use.requests = bucket(limits.rpm, old.requests if old else None)
        use.tokens = bucket(limits.tpm, old.tokens if old else None)
        for name, size in limits.model_tpm:
            made = bucket(size, old.models.get(name) if old else None)
            assert made is not None
            use.models[name] = made
        if limits.budget is not None and limits.budget_period_s is not None:
            was = old.budget if old else None
            use.budget = Budget(part(limits.budget) or 1, limits.budget_period_s)
            if was is not None and was.period_s == limits.budget_period_s:
                use.budget.slots, use.budget.total = was.slots, was.total
        use.inflight = old.inflight if old else 0
        return use

    def admit(
        self, client: str, limits: ClientLimits, model: str, tokens: int, *, prompt: int, now: float
    ) -> Ticket:
        """Reserve one request and ``tokens`` for ``client`` on ``model``; a 429
        ``Refusal`` naming the limit when one is over (nothing is taken then)."""
        use = self.use(client, limits, now)
        most = limits.max_inflight
        if most is not None and use.inflight >= max(most // self.share, 1):
            raise Refusal(
                429,
                f"client {client!r}: {use.inflight} requests in flight, its limit "
                f"max_inflight is {most}"
                + (f" ({max(most // self.share, 1)} on this worker)" if self.share > 1 else "")
                + "; wait for one to finish",
                code="max_inflight",
                type="requests",
                retry_after=1,
            )
        if self.shared:
            return self._admit_shared(
                use, client, limits, model=model, tokens=tokens, prompt=prompt, now=now
            )
        requests = use.requests
        if requests is not None and requests.refill(now) < 1:
            raise Refusal(
                429,
                f"client {client!r}: over its limit of {requests.size} requests a minute "
                "(rpm); retry after the Retry-After header's seconds",
                code="rate_limit_requests",
                type="requests",
                retry_after=_retry(requests.wait_s(1)),
            )
        model_bucket = use.models.get(model) if use.models else None
        for bucket in (use.tokens, model_bucket):
            if bucket is None:
                continue
            if tokens <= bucket.size and bucket.refill(now) >= tokens:
                continue
            what = "tpm" if bucket is use.tokens else f"tpm {model}"
            if tokens > bucket.size:
                raise Refusal(
                    429,
                    f"client {client!r}: the request reserves {tokens} tokens (its prompt "
                    f"and max_tokens), more than its limit {what} of {bucket.size} a "
                    "minute allows at once; ask for fewer max_tokens or a shorter prompt",
                    param="max_tokens",
                    code="rate_limit_tokens",
                    type="tokens",
                    retry_after=MAX_RETRY_AFTER_S,
                )
            raise Refusal(
                429,
                f"client {client!r}: over its limit {what} of {bucket.size} tokens a "
                f"minute (the request reserves {tokens}: its prompt and max_tokens); "
                "retry after the Retry-After header's seconds, or ask for fewer max_tokens",
                code="rate_limit_tokens",
                type="tokens",
                retry_after=_retry(bucket.wait_s(tokens)),
            )
        budget = use.budget
        if budget is not None:
            budget.expire(now)
            if budget.total + tokens > budget.size:
                wait = budget.wait_s(tokens, now)
                raise Refusal(
                    429,
                    f"client {client!r}: its budget of {budget.size} tokens over "
                    f"{budget.period_s} s is used ({budget.total} used, the request reserves "
                    f"{tokens}); room again in {math.ceil(wait)} s, or ask the operator "
                    "(`llmgw token limits`)",
                    code="budget_exhausted",
                    type="tokens",
                    retry_after=_retry(wait),
                )
        use.inflight += 1
        if requests is not None:
            requests.level -= 1
        for bucket in (use.tokens, model_bucket):
            if bucket is not None:
                bucket.level -= tokens
        slot = None
        if budget is not None:
            slot = budget.add(tokens, now)
        return Ticket(client, model, tokens, prompt, slot)

    def _holding(self, client: str, kind: str, size: int) -> Holding:
        key = (client, kind)
        found = self.holdings.get(key)
        if found is None or found.size != size:
            self._plans.clear()
            cap = CHUNK_SHARE * size / self.share
            if found is None:
                found = self.holdings[key] = Holding(size, cap, refills=kind != BUDGET)
            else:
                # A limit changed (`token limits`): what this gateway holds beyond the new
                # cap goes back at the next draw rather than being served under the old
                # limit (a leaked key cut to --rpm 1 stops at once), and the account's
                # last answer is read as the control plane resizes it: it keeps what it
                # lacked (catalog.forms.allowance.Account.resize).
                if found.held > cap:
                    excess = found.held - cap
                    found.held -= excess
                    found.give += excess
                if found.left is not None:
                    found.left = max(0, size - (found.size - found.left))
                found.size, found.cap = size, cap
        return found

    def _admit_shared(
        self,
        use: Use,
        client: str,
        limits: ClientLimits,
        *,
        model: str,
        tokens: int,
        prompt: int,
        now: float,
    ) -> Ticket:
        plan = self._plan(client, limits, model)
        for holding, one, what in plan.wanted:
            amount = 1 if one else tokens
            if holding.held >= amount:
                continue
            account = holding.account(now)
            room = account is None or account + holding.held + holding.give >= amount
            if (
                room
                and holding.held >= 0
                and holding.held - amount >= -holding.credit
                and now < holding.credit_until
                and self.renewable
            ):
                continue  # on the account's credit, lent here: the next grant pays it
            holding.short = amount
            holding.lacked = max(holding.lacked, amount - holding.held)
            holding.used += amount  # (demand: the rate counts what was refused too)
            holding.last = now
            if self.wake is not None:
                self.wake()
            raise self._short(client, limits, holding, amount, what=what, now=now, room=room)
        wake = False
        for holding, one, _what in plan.wanted:
            amount = 1 if one else tokens
            holding.held -= amount
            holding.used += amount
            holding.last = now
            if amount > holding.largest:  # noqa: PLR1730 (a call to max costs more)
                holding.largest = amount
            if holding.held < holding.low or holding.target == 0:
                wake = True
        if wake and self.wake is not None:
            self.wake()
        use.inflight += 1
        return Ticket(client, model, tokens, prompt, None, False, plan.spent)

    def _plan(self, client: str, limits: ClientLimits, model: str | None) -> _Plan:
        """``client``'s plan for ``model`` under ``limits`` (see ``_Plan``)."""
        key = (client, model)
        plan = self._plans.get(key)
        if plan is not None and plan.limits is limits:
            return plan
        wanted: list[tuple[Holding, bool, str]] = []
        if limits.rpm is not None:
            wanted.append((self._holding(client, REQUESTS, limits.rpm), True, "rpm"))
        if limits.tpm is not None:
            wanted.append((self._holding(client, TOKENS, limits.tpm), False, "tpm"))
        if limits.model_tpm and model is not None:
            size = limits.tpm_for(model)
            if size is not None:
                holding = self._holding(client, MODEL_PREFIX + model, size)
                wanted.append((holding, False, f"tpm {model}"))
        if limits.budget is not None and limits.budget_period_s is not None:
            wanted.append((self._holding(client, BUDGET, limits.budget), False, "budget"))
        shown = []
        for size, kind, name in (
            (limits.rpm, REQUESTS, b"requests"),
            (
                limits.tpm if limits.tpm is not None else limits.tpm_for(model or ""),
                TOKENS if limits.tpm is not None else MODEL_PREFIX + (model or ""),
                b"tokens",
            ),
        ):
            if size is not None:
                lines = b"x-ratelimit-limit-%b: %d\r\n" % (name, size)
                lines += b"x-ratelimit-remaining-%b: %%d\r\nx-ratelimit-reset-%b: %%b\r\n" % (
                    name,
                    name,
                )
                shown.append((size, self.holdings.get((client, kind)), lines))
        plan = _Plan(
            limits,
            tuple(wanted),
            tuple(h for h, one, _ in wanted if not one),
            tuple(shown),
        )
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        self._plans[key] = plan
        return plan

    def _short(
        self,
        client: str,
        limits: ClientLimits,
        holding: Holding,
        amount: int,
        *,
        what: str,
        now: float,
        room: bool = False,
    ) -> Refusal:
        """The refusal of a request this process does not hold enough for (``room``: the
        account had room for it at its last answer: this gateway is drawing more)."""
        if not self.renewable:
            return Refusal(
                503,
                f"client {client!r}: its allowance ({what}) could not be renewed from the "
                f"control plane ({self.renew_error or 'no answer'}); this gateway has served "
                "what it held and serves no more of it until the control plane answers. "
                "Retry after the Retry-After header's seconds",
                code="allowance_not_renewed",
                type="service_unavailable",
                retry_after=UNRENEWED_RETRY_S,
            )
        if room and amount <= holding.size:
            return Refusal(
                429,
                f"client {client!r}: this gateway is drawing more of its allowance ({what}) "
                "from the control plane (the request is over what it holds here, and the "
                "account's credit is lent to another gateway); retry after the "
                "Retry-After header's seconds",
                code="rate_limit_requests" if what == "rpm" else "rate_limit_tokens",
                type="requests" if what == "rpm" else "tokens",
                retry_after=1,
            )
        if what == "rpm":
            return Refusal(
                429,
                f"client {client!r}: over its limit of {holding.size} requests a minute "
                "(rpm); retry after the Retry-After header's seconds",
                code="rate_limit_requests",
                type="requests",
                retry_after=_retry(_shared_wait(holding, amount, now)),
            )
        if what == "budget":
            return Refusal(
                429,
                f"client {client!r}: its budget of {holding.size} tokens over "
                f"{limits.budget_period_s} s is used (the request reserves {amount}); room "
                "again as its oldest tokens leave the period, or ask the operator "
                "(`llmgw token limits`)",
                code="budget_exhausted",
                type="tokens",
                retry_after=MAX_RETRY_AFTER_S,
            )
        if amount > holding.size:
            return Refusal(
                429,
                f"client {client!r}: the request reserves {amount} tokens (its prompt "
                f"and max_tokens), more than its limit {what} of {holding.size} a "
                "minute allows at once; ask for fewer max_tokens or a shorter prompt",
                param="max_tokens",
                code="rate_limit_tokens",
                type="tokens",
                retry_after=MAX_RETRY_AFTER_S,
            )
        return Refusal(
            429,
            f"client {client!r}: over its limit {what} of {holding.size} tokens a "
            f"minute (the request reserves {amount}: its prompt and max_tokens); "
            "retry after the Retry-After header's seconds, or ask for fewer max_tokens",
            code="rate_limit_tokens",
            type="tokens",
            retry_after=_retry(_shared_wait(holding, amount, now)),
        )

    def draws(self, now: float, dt: float) -> list[Draw]:
        """What to ask the control plane for now (the allowance client's call): each
        holding's rate and target made again, then its draw when it has one."""
        out = []
        for (client, kind), holding in self.holdings.items():
            short = holding.short
            holding.plan(now, dt)
            want, give, ask = holding.draw()
            credit = holding.lend(now, short) if self.gateway else None
            line, reserve = credit or (0, 0)
            holding.credit_asked = None if credit is None else line
            if credit is not None and line < holding.credit:
                # Lowered (returned): at once, before the control plane lends the rest
                # to another gateway; never below what is owed (``lend``).
                holding.credit = line
            if line:
                holding.credit_sent = now
            if want or give or ask or credit is not None:
                out.append(_capped(Draw(client, kind, want, give, line, reserve, self.gateway)))
        return out

    def prepare(self, clients: Iterable[tuple[str, ClientLimits]], now: float) -> bool:
        """Holdings made for limited clients not yet seen here (a new token, a gateway
        just started), drawn at the next call ahead of their first request; True when
        one was made."""
        made = False
        for client, limits in clients:
            for kind, (size, _period) in kinds(limits).items():
                if (client, kind) not in self.holdings:
                    self._holding(client, kind, size).last = now
                    made = True
        return made

    def granted(self, answers: list[Answer], now: float) -> None:
        """The control plane's answer: grants added; a limit it does not know any more
        (revoked, removed) dropped."""
        self.renewable, self.renew_error = True, ""
        for a in answers:
            key = (a.client, a.kind)
            holding = self.holdings.get(key)
            if holding is None:
                continue
            if a.size is None:
                del self.holdings[key]
                self._plans.clear()
                continue
            # (Refunds may have come in since the draw was planned: never above the cap.)
            holding.refund(a.granted)
            holding.left, holding.left_at = a.left, now
            if holding.credit_asked is not None:
                # Lent or renewed: trusted from the call's sending on, never later.
                holding.credit, holding.contested = a.credit, a.contested
                holding.credit_until = (
                    holding.credit_sent + CREDIT_TRUST_S if a.credit else -math.inf
                )
                holding.credit_asked = None

    def unrenewed(self, reason: str) -> None:
        """The control plane did not answer: what is held is spent, then refused."""
        self.renewable, self.renew_error = False, reason[:300]

    def release(self) -> list[Draw]:
        """Everything held, to give back (a graceful stop)."""
        out = []
        for (client, kind), holding in self.holdings.items():
            give = max(0, math.floor(holding.held + holding.give))
            holding.held -= give
            holding.give = 0.0
            # The credit returned too unless owed on (its lease then runs out, and the
            # account is charged its line).
            back = holding.credit > 0 and holding.held >= 0
            if back:
                holding.credit, holding.credit_until = 0, -math.inf
            if give or back:
                out.append(_capped(Draw(client, kind, 0, give, 0, 0, self.gateway)))
        return out

    def settle(self, ticket: Ticket, used: int, now: float) -> None:
        """The request ended having used ``used`` tokens (the engine's usage): its
        reservation is given back and that taken instead. Once per ticket."""
        if ticket.settled:
            return
        ticket.settled = True
        use = self.uses.get(ticket.client)
        if use is None:
            return
        use.inflight = max(use.inflight - 1, 0)
        delta = used - ticket.reserved
        if self.shared:
            for holding in ticket.spent:
                holding.refund(-delta)
            return
        for bucket in (use.tokens, use.models.get(ticket.model) if use.models else None):
            if bucket is not None:
                bucket.refill(now)
                bucket.level = min(bucket.size, bucket.level - delta)
        if use.budget is not None and (delta > 0 or ticket.slot in use.budget.slots):
            # A refund goes back where the reservation was counted; one whose slot has
            # left the window has nothing left to give back.
            use.budget.add(delta, now, ticket.slot)

    def headers(self, client: str, limits: ClientLimits, model: str | None, now: float
                ) -> list[tuple[bytes, bytes]]:  # fmt: skip
        """OpenAI's ``x-ratelimit-*`` headers for a limited token's answer: the requests
        bucket, and the tokens one (``tpm``, else the model's own)."""
        if self.shared:
            return pairs(self._shared_head(client, limits, model))
        use = self.use(client, limits, now)
        shown = use.shown
        if shown is None or (use.tokens is None and use.shown_model != model):
            shown = use.shown = _shown(use, model)
            use.shown_model = model
        out: list[tuple[bytes, bytes]] = []
        for bucket, remaining, reset, limit in shown:
            level = bucket.refill(now)
            out += (
                limit,
                (remaining, b"%d" % level if level > 0 else b"0"),
                (reset, _duration(bucket.reset_s())),
            )
        return out

    def head(self, client: str, limits: ClientLimits, model: str | None, now: float) -> bytes:
        """The same headers as header lines (``name: value\\r\\n`` each), made of
        constants and numbers only: what the server writes without checking each one
        again (``httpguard.protocol.RequestHooks.start``)."""
        if self.shared:
            return self._shared_head(client, limits, model)
        return b"".join([b"%b: %b\r\n" % pair for pair in self.headers(client, limits, model, now)])

    def _shared_head(self, client: str, limits: ClientLimits, model: str | None) -> bytes:
        """From what the accounts had at their last answer and what is held here: the
        remaining figure another gateway's use since then lowers."""
        out = b""
        for size, holding, lines in self._plan(client, limits, model).shown:
            if holding is None:
                remaining = float(size)
            else:
                left = holding.left
                remaining = (size if left is None else left) + holding.held
                if remaining > size:
                    remaining = float(size)
                elif remaining < 0:
                    remaining = 0.0
            out += lines % (remaining, _duration((size - remaining) * MINUTE / size))
        return out


def _capped(d: Draw) -> Draw:
    """One line of the allowance call, each amount at most ``MAX_AMOUNT``: what the
    control plane takes (catalog.forms.allowance.parse_draws), which refuses the whole
    call for one line above it. What a holding owes is the engines' word (a request
    settles to its answer's ``usage``, up to 12 digits a count): a hostile engine's
    counts on a few hundred requests in flight made one client's ``want`` and credit
    line larger, and the call carrying every limited client's draws was refused every
    round, for good (all of them refused 503 ``allowance_not_renewed``). Asked for at
    most ``MAX_AMOUNT``, such a client owes on (its own requests refused); the others
    are drawn for as before."""
    return Draw(
        d.client,
        d.kind,
        min(d.want, MAX_AMOUNT),
        min(d.give_back, MAX_AMOUNT),
        min(d.credit, MAX_AMOUNT),
        min(d.reserve, MAX_AMOUNT),
        d.gateway,
    )


def _shared_wait(holding: Holding, amount: int, now: float) -> float:
    """Seconds until the account has refilled what the request lacks here."""
    lacking = amount - holding.held - holding.give - (holding.account(now) or 0.0)
    return max(0.0, lacking) * MINUTE / holding.size


def _shown(
    use: Use, model: str | None
) -> tuple[tuple[Bucket, bytes, bytes, tuple[bytes, bytes]], ...]:
    """The buckets the headers show, with their names and limit header made once."""
    out = []
    for bucket, kind in (
        (use.requests, b"requests"),
        (use.tokens or (use.models.get(model) if model else None), b"tokens"),
    ):
        if bucket is not None:
            limit = (b"x-ratelimit-limit-" + kind, b"%d" % bucket.size)
            out.append(
                (bucket, b"x-ratelimit-remaining-" + kind, b"x-ratelimit-reset-" + kind, limit)
            )
    return tuple(out)


# The sub-second reset times, made once: a client far from its limits shows one on
# every answer (formatting one was a sixth of the quota stage's cost).
_MILLISECONDS = tuple(b"%dms" % ms for ms in range(1001))


def _duration(seconds: float) -> bytes:
    """OpenAI's form of a reset time: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return _MILLISECONDS[max(0, math.ceil(seconds * 1000))]
    if seconds < 60:
        return b"%gs" % round(seconds, 3)
    minutes, rest = divmod(seconds, 60)
    return b"%dm%ds" % (minutes, math.ceil(rest))
