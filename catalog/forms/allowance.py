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
(gateway.stages.quota, where the bound is derived).

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

    def left(self) -> int:
        return max(0, math.floor(self.level))


@dataclass(frozen=True, slots=True)
class Draw:
    """One line of a gateway's call: for ``client``'s ``kind``, ``want`` more units
    and ``give_back`` it did not use."""

    client: str
    kind: str
    want: int
    give_back: int


@dataclass(frozen=True, slots=True)
class Granted:
    """The answer to a ``Draw``: ``granted`` units, what the account has ``left`` and its
    ``size`` (None: the client has no such limit now, or is unknown)."""

    client: str
    kind: str
    granted: int
    left: int
    size: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "kind": self.kind,
            "granted": self.granted,
            "left": self.left,
            "size": self.size,
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


_DRAW_KEYS = frozenset({"client", "kind", "want", "give_back"})
_ANSWER_KEYS = frozenset({"client", "kind", "granted", "left", "size"})


def _known(entry: Mapping[str, Any], keys: frozenset[str], where: str) -> None:
    extra = sorted(set(entry) - keys)
    if extra:
        raise AllowanceError(
            f"{where}: unknown field(s) {', '.join(map(repr, extra))[:200]}; a draw has "
            f"{', '.join(sorted(keys))}"
        )


def parse_draws(body: Any) -> list[Draw]:
    """The draws of ``{"draws": [{"client", "kind", "want", "give_back"}, ...]}``."""
    if not isinstance(body, dict) or not isinstance(body.get("draws"), list) or len(body) != 1:
        raise AllowanceError('the body must be {"draws": [...]}, nothing else')
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
            )
        )
    return out
