"""A client token's limits: requests and tokens a minute, requests in flight, a budget.

Pure. What ``llmgw token new --rpm/--tpm/--max-inflight/--budget`` and ``llmgw token
limits`` write, the token table stores (a JSON object in ``tokens.limits``), the
``token.issued`` and ``token.limits_changed`` events record, and a gateway enforces
(gateway.stages.quota). Every figure is bounded here, once, so each reader (the command
line, replay, the control plane's route, a gateway reading that route) takes only what
the others could have written, and a refusal names the flag and what to write.

The written forms:

- ``--rpm 600``, ``--max-inflight 32``: a whole number;
- ``--tpm 200000`` (every model together) or ``--tpm chat=100000`` (one model, by its
  catalog name), a number with an optional K, M, G or T (thousands, millions, ...);
- ``--budget 50M/30d``: tokens over a rolling period of minutes, hours or days;
- ``none`` for any of them removes that limit (``token limits``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

# The bounds of each figure: a limit beyond them is a typing mistake, not a plan.
MAX_RPM = 10_000_000
MAX_TPM = 10**12
MAX_INFLIGHT = 100_000
MAX_BUDGET = 10**15
MIN_PERIOD_S = 60
MAX_PERIOD_S = 366 * 86_400
# Per-model token limits a token may carry.
MAX_MODEL_LIMITS = 100
# The longest text a figure may be written in (``--budget 1000000000000000/366d``).
MAX_TEXT = 64

_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}")
_AMOUNT = re.compile(r"([0-9]{1,16})([KMGT]?)")
_PERIOD = re.compile(r"([0-9]{1,6})([mhd])")
_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_PERIOD_UNIT = {"m": 60, "h": 3600, "d": 86_400}
NONE = "none"


class LimitError(ValueError):
    """A limit that cannot be taken; the message names the flag and what to write."""


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """A client token's limits; None (or empty) where it has none."""

    rpm: int | None = None
    tpm: int | None = None
    # (model, tokens a minute) in name order: one model's own limit, besides ``tpm``.
    model_tpm: tuple[tuple[str, int], ...] = ()
    max_inflight: int | None = None
    budget: int | None = None
    budget_period_s: int | None = None

    @property
    def empty(self) -> bool:
        return self == NO_LIMITS

    def tpm_for(self, model: str) -> int | None:
        for name, tokens in self.model_tpm:
            if name == model:
                return tokens
        return None

    def to_json(self) -> dict[str, Any]:
        """The stored and published form: only the limits set."""
        out: dict[str, Any] = {}
        if self.rpm is not None:
            out["rpm"] = self.rpm
        if self.tpm is not None:
            out["tpm"] = self.tpm
        if self.model_tpm:
            out["model_tpm"] = dict(self.model_tpm)
        if self.max_inflight is not None:
            out["max_inflight"] = self.max_inflight
        if self.budget is not None and self.budget_period_s is not None:
            out["budget"] = {"tokens": self.budget, "period_s": self.budget_period_s}
        return out

    def describe(self) -> str:
        """One line for people: ``rpm 600, tpm 200000, tpm chat=100000, ...``; ``-``."""
        parts = []
        if self.rpm is not None:
            parts.append(f"rpm {self.rpm}")
        if self.tpm is not None:
            parts.append(f"tpm {self.tpm}")
        parts += [f"tpm {m}={n}" for m, n in self.model_tpm]
        if self.max_inflight is not None:
            parts.append(f"max-inflight {self.max_inflight}")
        if self.budget is not None and self.budget_period_s is not None:
            parts.append(f"budget {format_budget(self.budget, self.budget_period_s)}")
        return ", ".join(parts) or "-"


NO_LIMITS = ClientLimits()


def _whole(flag: str, text: str, most: int) -> int:
    if len(text) > MAX_TEXT or not text.isascii() or not text.isdigit():
        raise LimitError(f"{flag} {text[:MAX_TEXT]!r}: write a whole number from 1 to {most}")
    value = int(text)
    if not 1 <= value <= most:
        raise LimitError(f"{flag} {value}: write a whole number from 1 to {most}")
    return value


def _amount(flag: str, text: str, most: int) -> int:
    found = _AMOUNT.fullmatch(text.strip()) if len(text) <= MAX_TEXT else None
    if found is None:
        raise LimitError(
            f"{flag} {text[:MAX_TEXT]!r}: write a number of tokens, optionally with K, M, G "
            f"or T (e.g. 200000 or 200K), from 1 to {most}"
        )
    value = int(found.group(1)) * _SUFFIX[found.group(2)]
    if not 1 <= value <= most:
        raise LimitError(f"{flag} {text}: {value} tokens; write from 1 to {most}")
    return value


def parse_rpm(text: str) -> int | None:
    return None if text.strip() == NONE else _whole("--rpm", text.strip(), MAX_RPM)


def parse_max_inflight(text: str) -> int | None:
    return None if text.strip() == NONE else _whole("--max-inflight", text.strip(), MAX_INFLIGHT)


def parse_tpm(text: str) -> tuple[str | None, int | None]:
    """``200000`` (model None: every model) or ``chat=100000``; ``none`` for no limit."""
    text = text.strip()
    model: str | None = None
    if "=" in text:
        model, _, text = text.partition("=")
        model = model.strip()
        if not _MODEL.fullmatch(model):
            raise LimitError(
                f"--tpm {model[:MAX_TEXT]!r}=...: the model must be a catalog name "
                "(letters, digits and ._:/@-, at most 128), as in --tpm chat=100000"
            )
        text = text.strip()
    if text == NONE:
        return model, None
    return model, _amount("--tpm" if model is None else f"--tpm {model}=", text, MAX_TPM)


def parse_budget(text: str) -> tuple[int, int] | None:
    """``50M/30d``: tokens over a rolling period (minutes, hours or days); ``none``."""
    text = text.strip()
    if text == NONE:
        return None
    amount, slash, period = text.partition("/")
    found = _PERIOD.fullmatch(period.strip()) if slash and len(text) <= MAX_TEXT else None
    if found is None:
        raise LimitError(
            f"--budget {text[:MAX_TEXT]!r}: write tokens/period, e.g. 50M/30d (tokens with an "
            "optional K, M, G or T; the period in m, h or d)"
        )
    seconds = int(found.group(1)) * _PERIOD_UNIT[found.group(2)]
    if not MIN_PERIOD_S <= seconds <= MAX_PERIOD_S:
        raise LimitError(
            f"--budget {text}: the period must be from 1m to 366d (a rolling window of that length)"
        )
    return _amount("--budget", amount, MAX_BUDGET), seconds


def format_budget(tokens: int, period_s: int) -> str:
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if period_s % size == 0:
            return f"{tokens}/{period_s // size}{unit}"
    return f"{tokens}/{period_s}s"  # (never written: periods are whole minutes)


@dataclass(frozen=True, slots=True)
class LimitChange:
    """What the flags of one command say: each limit named is set (or removed: None);
    the others stay."""

    rpm: tuple[bool, int | None] = (False, None)
    tpm: tuple[bool, int | None] = (False, None)
    model_tpm: tuple[tuple[str, int | None], ...] = ()
    max_inflight: tuple[bool, int | None] = (False, None)
    budget: tuple[bool, tuple[int, int] | None] = (False, None)

    @property
    def empty(self) -> bool:
        return self == LimitChange()


def parse_change(
    *,
    rpm: str | None = None,
    tpm: list[str] | None = None,
    max_inflight: str | None = None,
    budget: str | None = None,
) -> LimitChange:
    """The command line's flags as a change (each flag bounded and checked)."""
    overall: tuple[bool, int | None] = (False, None)
    models: dict[str, int | None] = {}
    for text in tpm or ():
        model, value = parse_tpm(text)
        if model is None:
            overall = (True, value)
        else:
            models[model] = value
    if len(models) > MAX_MODEL_LIMITS:
        raise LimitError(f"--tpm: at most {MAX_MODEL_LIMITS} models may have a limit of their own")
    return LimitChange(
        rpm=(False, None) if rpm is None else (True, parse_rpm(rpm)),
        tpm=overall,
        model_tpm=tuple(sorted(models.items())),
        max_inflight=(False, None)
        if max_inflight is None
        else (True, parse_max_inflight(max_inflight)),
        budget=(False, None) if budget is None else (True, parse_budget(budget)),
    )


def apply(limits: ClientLimits, change: LimitChange) -> ClientLimits:
    """``limits`` with ``change`` made."""
    out = limits
    if change.rpm[0]:
        out = replace(out, rpm=change.rpm[1])
    if change.tpm[0]:
        out = replace(out, tpm=change.tpm[1])
    if change.model_tpm:
        models = dict(out.model_tpm)
        for name, value in change.model_tpm:
            if value is None:
                models.pop(name, None)
            else:
                models[name] = value
        if len(models) > MAX_MODEL_LIMITS:
            raise LimitError(
                f"--tpm: at most {MAX_MODEL_LIMITS} models may have a limit of their own"
            )
        out = replace(out, model_tpm=tuple(sorted(models.items())))
    if change.max_inflight[0]:
        out = replace(out, max_inflight=change.max_inflight[1])
    if change.budget[0]:
        tokens, period = change.budget[1] or (None, None)
        out = replace(out, budget=tokens, budget_period_s=period)
    return out


def _bounded(value: Any, key: str, most: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise LimitError(f"limits {key}: not a whole number from 1 to {most}")
    return value


def from_json(data: Any) -> ClientLimits:
    """The stored or published form read back, every figure checked (``LimitError``)."""
    if data is None:
        return NO_LIMITS
    if not isinstance(data, Mapping):
        raise LimitError("limits: not an object")
    unknown = sorted(set(data) - {"rpm", "tpm", "model_tpm", "max_inflight", "budget"})
    if unknown:
        raise LimitError(f"limits: unknown key(s) {', '.join(map(str, unknown))[:200]}")
    raw_models = data.get("model_tpm") or {}
    if not isinstance(raw_models, Mapping) or len(raw_models) > MAX_MODEL_LIMITS:
        raise LimitError(f"limits model_tpm: not an object of at most {MAX_MODEL_LIMITS} models")
    models = []
    for name, tokens in raw_models.items():
        if not isinstance(name, str) or not _MODEL.fullmatch(name):
            raise LimitError("limits model_tpm: a key is not a model name")
        models.append((name, _bounded(tokens, "model_tpm", MAX_TPM) or 0))
    budget, period = None, None
    raw_budget = data.get("budget")
    if raw_budget is not None:
        if not isinstance(raw_budget, Mapping):
            raise LimitError("limits budget: not an object of tokens and period_s")
        budget = _bounded(raw_budget.get("tokens"), "budget tokens", MAX_BUDGET)
        period = _bounded(raw_budget.get("period_s"), "budget period_s", MAX_PERIOD_S)
        if budget is None or period is None or period < MIN_PERIOD_S:
            raise LimitError("limits budget: needs tokens and a period_s of 60 to 366 days")
    limits = ClientLimits(
        rpm=_bounded(data.get("rpm"), "rpm", MAX_RPM),
        tpm=_bounded(data.get("tpm"), "tpm", MAX_TPM),
        model_tpm=tuple(sorted(models)),
        max_inflight=_bounded(data.get("max_inflight"), "max_inflight", MAX_INFLIGHT),
        budget=budget,
        budget_period_s=period,
    )
    # NO_LIMITS itself when none: the request path tells an unlimited token by identity.
    return NO_LIMITS if limits == NO_LIMITS else limits
