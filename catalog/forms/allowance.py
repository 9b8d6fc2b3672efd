"""A client's shared allowance: the accounts the control plane grants chunks from.

Pure. Every limited client token has one account per rate or budget limit (its
``kind``), kept in the database and shared by every control-plane replica:

- ``requests`` (``rpm``), ``tokens`` (``tpm``) and ``tokens:MODEL`` (``tpm MODEL=``) are
  token buckets, the same rule a single gateway applies: a bucket holds up to a minute's
  limit, starts full and refills continuously at the limit a minute;
- ``budget`` counts the tokens granted over the rolling period, in ``BUDGET_SLOTS``
  slots of it (a slot leaves the window when all of it has).

A gateway draws chunks from the accounts (``grant``), spends them on its own, and gives
back what it did not use (``give_back``). A grant is taken out of the account at once, so
what every gateway together can spend is what one bucket allows plus what they held
when the interval began: each holds at most ``CHUNK_SHARE`` of the limit
(gateway.stages.quota, where the bound is derived). What a gateway gives back is taken
only as far as its id was granted and has not given back (``Account.take_back``): a
gateway token that gives back what it never drew does not mint units for the others.

**Credit.** Each account also lends credit: the right to admit a request a gateway
does not hold enough for, owing the rest until its next grant pays it. What it lends,
every gateway's line together, is at most its ``pool``: the largest reservation a gateway
said its requests make (``reserve``); before any was said, it is lent whole to one
gateway only. A gateway admits on credit only when it owes nothing, so whatever every
gateway together owes is at most one request's reservation. A line is lent for a lease
its holder renews with each call (``Account.lend``), and comes back when its holder
returns it (a call that asks for none, made only while it owes nothing) or when the
lease runs out unrenewed (a gateway killed, cut off): the account is then charged the
line, as if it had been granted, which covers whatever the holder owed, before it is
lent again.

The wire form (``POST /v1/gateway/allowances``) is parsed here, bounded, so the
control plane and the gateway read only what the other could have written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from catalog.forms.client_limits import ClientLimits
from catalog.forms.printable import printable

# The most a gateway holds of a limit (all its workers together): 5%. With two
# gateways what they hold is at most 10% of it.
CHUNK_SHARE = 0.05
REQUESTS = "requests"
TOKENS = "tokens"
BUDGET = "budget"
MODEL_PREFIX = "tokens:"
# A budget's period is counted in this many slots (as a single gateway counts it).
BUDGET_SLOTS = 60
MINUTE = 60.0
# The most draws one call carries, and the longest client name and kind.
MAX_DRAWS = 10_000
MAX_NAME = 64
MAX_KIND = 7 + 128
# A draw asks for at most this many units (a limit's own bound is smaller).
MAX_AMOUNT = 10**15
# How long an account's credit stays lent without a call of its holder renewing it
# (the control plane's clock), and how long after sending the call that was answered
# the holder uses it (its own clock: shorter, so it stops before the control plane may
# lend it again, whatever the call's delay and the two clocks' rates).
CREDIT_LEASE_S = 10.0
# Lines of credit one account lends at once (gateway processes holding one): the
# account's row holds them all, so their number is bounded whatever the callers (a
# gateway token that names a new gateway id on every call must not grow it without end).
MAX_LINES = 64
CREDIT_TRUST_S = 5.0
# The longest gateway id.
MAX_GATEWAY = 64
# Gateway ids an account keeps what it granted them and they did not give back (the
# least recently seen forgotten first: its give-back is then taken as nothing, the
# client granted less, never more), so a gateway token that names a new id on every
# call does not grow the row without end.
MAX_HOLDERS = 256


class AllowanceError(ValueError):
    """A draw that cannot be read; the message names the field."""


def kinds(limits: ClientLimits) -> dict[str, tuple[int, int | None]]:
    """Each account a client's limits have: kind -> (size, budget period or None)."""
    out: dict[str, tuple[int, int | None]] = {}
    if limits.rpm is not None:
        out[REQUESTS] = (limits.rpm, None)
    if limits.tpm is not None:
        out[TOKENS] = (limits.tpm, None)
    for model, size in limits.model_tpm:
        out[MODEL_PREFIX + model] = (size, None)
    if limits.budget is not None and limits.budget_period_s is not None:
        out[BUDGET] = (limits.budget, limits.budget_period_s)
    return out


@dataclass(slots=True)
class Account:
    """One limit's account. A bucket: ``level`` left to grant at ``at`` (epoch
    seconds). A budget: ``slots`` of tokens granted (slot -> tokens), ``period_s``."""

    size: int
    level: float
    at: float
    period_s: int | None = None
    slots: dict[int, int] = field(default_factory=dict)
    # The credit: the lines lent (gateway -> [line, until when: epoch seconds]), the
    # pool they share, and until when a gateway asked for more than was left (the
    # holders are told: they return theirs when they owe nothing).
    lent: dict[str, list[float]] = field(default_factory=dict)
    pool: int = 0
    wanted: float = 0.0
    # What each gateway id was granted and has not given back (gateway -> [units, when
    # it was last granted: epoch seconds]): the most its give-back is taken for.
    held: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def new(cls, size: int, period_s: int | None, now: float) -> Account:
        """A fresh account: a full bucket, an unused budget."""
        return cls(size, float(size), now, period_s)

    def _slot(self, now: float) -> int:
        assert self.period_s is not None
        return int(now * BUDGET_SLOTS // self.period_s)

    def resize(self, size: int, period_s: int | None, now: float) -> None:
        """Under (new) limits: a bucket of a new size keeps what it lacked (as a single
        gateway's does); a budget keeps its slots when the period is the same."""
        self.refill(now)
        if period_s != self.period_s:
            self.slots = {}
            self.period_s = period_s
            self.level = float(size)
        elif period_s is None and size != self.size:
            self.level = size - (self.size - self.level)
        self.size = size
        self.pool = min(self.pool, size)

    def refill(self, now: float) -> None:
        if self.period_s is not None:
            oldest = self._slot(now) - BUDGET_SLOTS
            for slot in [s for s in self.slots if s <= oldest]:
                del self.slots[slot]
            self.level = float(self.size - sum(self.slots.values()))
        elif now > self.at:
            self.level = min(float(self.size), self.level + (now - self.at) * self.size / MINUTE)
        self.at = max(self.at, now)

    def grant(self, want: int, now: float) -> int:
        """Up to ``want`` whole units taken out of the account, as many as it has."""
        self.refill(now)
        granted = max(0, min(want, math.floor(self.level)))
        if granted and self.period_s is not None:
            slot = self._slot(now)
            self.slots[slot] = self.slots.get(slot, 0) + granted
        self.level -= granted
        return granted

    def give_back(self, amount: int, now: float) -> None:
        """Units a gateway did not use: back in the account (a bucket at most full; a
        budget's newest slots first, never below nothing)."""
        self.refill(now)
        if amount <= 0:
            return
        if self.period_s is None:
            self.level = min(float(self.size), self.level + amount)
            return
        for slot in sorted(self.slots, reverse=True):
            took = min(amount, self.slots[slot])
            self.slots[slot] -= took
            amount -= took
            if amount <= 0:
                break
        self.slots = {s: t for s, t in self.slots.items() if t > 0}
        self.level = float(self.size - sum(self.slots.values()))

    def take_back(self, gateway: str, amount: int, now: float) -> int:
        """``gateway`` gives back ``amount``: taken as far as it was granted and has not
        given back (more, from a hostile gateway token, would be units no gateway drew
        granted again), and given back to the account. The amount taken."""
        line = self.held.get(gateway)
        taken = max(0, min(amount, math.floor(line[0]) if line else 0))
        if line is not None:
            line[0] -= taken
            if line[0] <= 0:
                del self.held[gateway]
        self.give_back(taken, now)
        return taken

    def hold(self, gateway: str, granted: int, now: float) -> None:
        """``granted`` units to ``gateway``: counted as what it may give back."""
        if granted <= 0:
            return
        line = self.held.pop(gateway, None) or [0.0, now]
        self.held[gateway] = [min(line[0] + granted, float(MAX_AMOUNT)), now]
        while len(self.held) > MAX_HOLDERS:
            del self.held[min(self.held, key=lambda g: self.held[g][1])]

    def left(self) -> int:
        return max(0, math.floor(self.level))

    def charge(self, amount: int, now: float) -> None:
        """``amount`` taken out of the account as a grant is, whether it has it or not
        (a bucket below empty refills from there; a budget counts it now)."""
        self.refill(now)
        if self.period_s is not None:
            slot = self._slot(now)
            self.slots[slot] = self.slots.get(slot, 0) + amount
        self.level -= amount

    def lend(self, gateway: str, line: int, reserve: int, now: float) -> tuple[int, bool]:
        """Credit for ``gateway`` asking for a ``line`` (0: it holds none, or returns
        it), its requests reserving up to ``reserve`` (0: none seen yet): (the line it
        holds now, 0 for none; whether a gateway asked for more than was left).

        A lease run out unrenewed charges the account its line first (what its holder
        may owe, paid). The pool grows to the largest ``reserve`` said (at most the
        limit); each line is set to what its holder asks as far as the pool has room
        (a holder asks for no less than it owes). While nothing is known of the
        client's requests (the pool empty), the credit is lent whole to one gateway
        and to no other: it owes one request at most, as any holder (a gateway admits
        on credit only when it owes nothing)."""
        for holder, (held, until) in list(self.lent.items()):
            if until <= now:
                self.charge(math.ceil(held), now)
                del self.lent[holder]
        if not gateway:
            return 0, False  # (an older gateway: it borrows nothing)
        self.pool = min(max(self.pool, reserve), self.size)
        self.lent.pop(gateway, None)
        if line <= 0:
            return 0, False
        if len(self.lent) >= MAX_LINES:
            got = 0  # (lent to as many gateways as an account holds: none for another)
        elif self.pool == 0:
            got = 0 if self.lent else self.size
        else:
            got = max(0, min(line, self.pool - math.ceil(sum(h for h, _ in self.lent.values()))))
        if got < line:
            self.wanted = now + CREDIT_LEASE_S
        if got <= 0:
            return 0, False
        self.lent[gateway] = [got, now + CREDIT_LEASE_S]
        return got, self.wanted > now


@dataclass(frozen=True, slots=True)
class Draw:
    """One line of a gateway's call: for ``client``'s ``kind``, ``want`` more units
    and ``give_back`` it did not use; ``credit``: the line of credit it asks for or
    renews (0: none, or it returns the one it holds), its requests reserving up to
    ``reserve``; ``gateway``: the calling gateway's id (the call's, the same on every
    line)."""

    client: str
    kind: str
    want: int
    give_back: int
    credit: int = 0
    reserve: int = 0
    gateway: str = ""


@dataclass(frozen=True, slots=True)
class Granted:
    """The answer to a ``Draw``: ``granted`` units, what the account has ``left`` and its
    ``size`` (None: the client has no such limit now, or is unknown); ``credit``: the
    line of credit the gateway holds now (0: none), ``contested`` when another gateway
    asked for it."""

    client: str
    kind: str
    granted: int
    left: int
    size: int | None
    credit: int = 0
    contested: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "kind": self.kind,
            "granted": self.granted,
            "left": self.left,
            "size": self.size,
            "credit": self.credit,
            "contested": self.contested,
        }


def _amount(entry: Mapping[str, Any], key: str, where: str) -> int:
    value = entry.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_AMOUNT:
        raise AllowanceError(f"{where}.{key}: a whole number from 0 to {MAX_AMOUNT}")
    return value


def _text(entry: Mapping[str, Any], key: str, most: int, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= most or not printable(value):
        raise AllowanceError(f"{where}.{key}: printable text of 1 to {most} characters")
    return value


_DRAW_KEYS = frozenset({"client", "kind", "want", "give_back", "credit", "reserve"})
_ANSWER_KEYS = frozenset({"client", "kind", "granted", "left", "size", "credit", "contested"})


def _known(entry: Mapping[str, Any], keys: frozenset[str], where: str) -> None:
    extra = sorted(set(entry) - keys)
    if extra:
        raise AllowanceError(
            f"{where}: unknown field(s) {', '.join(map(repr, extra))[:200]}; a draw has "
            f"{', '.join(sorted(keys))}"
        )


def parse_draws(body: Any) -> list[Draw]:
    """The draws of ``{"gateway": ID, "draws": [{"client", "kind", "want", "give_back",
    "credit"}, ...]}`` (``gateway`` and ``credit`` optional: an older gateway's call)."""
    if (
        not isinstance(body, dict)
        or not isinstance(body.get("draws"), list)
        or set(body) - {"draws", "gateway"}
    ):
        raise AllowanceError(
            'the body must be {"draws": [...]} (and the gateway\'s id, "gateway"), nothing else'
        )
    gateway = "" if "gateway" not in body else _text(body, "gateway", MAX_GATEWAY, "body")
    entries = body["draws"]
    if len(entries) > MAX_DRAWS:
        raise AllowanceError(f"draws: at most {MAX_DRAWS} in one call")
    out = []
    for i, entry in enumerate(entries):
        where = f"draws[{i}]"
        if not isinstance(entry, dict):
            raise AllowanceError(f"{where}: an object")
        _known(entry, _DRAW_KEYS, where)
        out.append(
            Draw(
                _text(entry, "client", MAX_NAME, where),
                _text(entry, "kind", MAX_KIND, where),
                _amount(entry, "want", where),
                _amount(entry, "give_back", where),
                _amount(entry, "credit", where),
                _amount(entry, "reserve", where),
                gateway,
            )
        )
    return out


def parse_granted(body: Any) -> list[Granted]:
    """The answers of ``{"draws": [{"client", "kind", "granted", "left", "size"}, ...]}``."""
    if not isinstance(body, dict) or not isinstance(body.get("draws"), list):
        raise AllowanceError('the answer must be {"draws": [...]}')
    entries = body["draws"]
    if len(entries) > MAX_DRAWS:
        raise AllowanceError(f"draws: at most {MAX_DRAWS} in one answer")
    out = []
    for i, entry in enumerate(entries):
        where = f"draws[{i}]"
        if not isinstance(entry, dict):
            raise AllowanceError(f"{where}: an object")
        size = entry.get("size")
        out.append(
            Granted(
                _text(entry, "client", MAX_NAME, where),
                _text(entry, "kind", MAX_KIND, where),
                _amount(entry, "granted", where),
                _amount(entry, "left", where),
                None if size is None else _amount(entry, "size", where),
                _amount(entry, "credit", where),
                entry.get("contested") is True,
            )
        )
    return out
