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

With ``llmgw gateway --workers N`` each worker is a ``Quotas(share=N)`` and holds 1/N
of every limit (rounded down, at least 1): the workers share no memory, and the
kernel spreads connections over them, so together they never serve more than the
limit. Sharing a limit across processes and gateways (allowance chunks drawn from the
control plane) is issue 39's second half.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from catalog.forms.client_limits import ClientLimits
from gateway.stages.admission import (
    EMBEDDINGS,
    Refusal,
    Request,
    Window,
    estimate,
)
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

    def __init__(self, share: int = 1) -> None:
        self.uses: dict[str, Use] = {}
        # This process's share of each limit: 1/share of it (``--workers``).
        self.share = max(share, 1)

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


def _duration(seconds: float) -> bytes:
    """OpenAI's form of a reset time: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return b"%dms" % math.ceil(seconds * 1000)
    if seconds < 60:
        return b"%gs" % round(seconds, 3)
    minutes, rest = divmod(seconds, 60)
    return b"%dm%ds" % (minutes, math.ceil(rest))
