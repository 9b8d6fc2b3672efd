"""Durations as operators write them: ``90s``, ``20m``, ``1h30m``, or plain seconds.

The Go control plane this ports accepted Go duration strings, so existing
configuration keeps working; a bare number is taken as seconds because that is
what every YAML author reaches for first.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

_A = TypeVar("_A")
_R = TypeVar("_R")

# Each unit as a timedelta keyword, so a written duration is summed exactly.
_UNITS = {"us": "microseconds", "ms": "milliseconds", "s": "seconds", "m": "minutes", "h": "hours"}
# ASCII digits: Python's \d also takes other scripts' digits (float() reads "٣"), which
# the API document's pattern, read by ECMA-262 engines, does not.
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(us|ms|h|m|s)")

# A catalog holds a handful of distinct durations ("20m", "2s", "80ms"), yet each is
# parsed again for every stored event replay reads and written out again for every
# add (``Model.to_definition``, the stored payload): formatting was a fifth of
# encoding a definition. Both are pure, so each answer is remembered, in one bounded
# memo per direction.
_MEMO_MAX = 4096


def _remembered(key_type: type) -> Callable[[Callable[[_A], _R]], Callable[[_A], _R]]:
    """Remember ``compute``'s answers for arguments of exactly ``key_type``.

    Exactly: a ``bool`` hashes and compares like an ``int``, and a subclass of
    ``timedelta`` like its value, and neither must be given another's answer. Only
    answers are kept (a refusal is raised every time), and the memo is emptied when
    full, which keeps it bounded without bookkeeping on the path that finds an answer.
    """

    def wrap(compute: Callable[[_A], _R]) -> Callable[[_A], _R]:
        memo: dict[Any, _R] = {}

        @functools.wraps(compute)
        def remembered(value: _A) -> _R:
            if type(value) is not key_type:
                return compute(value)
            found = memo.get(value)
            if found is None:
                found = compute(value)
                if len(memo) >= _MEMO_MAX:
                    memo.clear()
                memo[value] = found
            return found

        return remembered

    return wrap


@_remembered(str)
def parse_duration(value: object) -> timedelta:
    """Turn a duration as written in YAML or JSON into a timedelta.

    Raises ValueError with the accepted forms, so the catalog's refusal can
    quote it to the operator.
    """
    if isinstance(value, timedelta):
        return value
    try:
        parsed = _parse(value)
    except OverflowError:
        # Infinity, or more days than a timedelta holds: a refusal, not a crash.
        raise ValueError(f"duration {value!r} is too large") from None
    if parsed is None:
        raise ValueError(f"{value!r} is not a duration; write e.g. 90s, 20m, 1h30m or seconds")
    return parsed


def _parse(value: object) -> timedelta | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"duration {value} is negative")
        return timedelta(seconds=value)
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", text):
            return timedelta(seconds=float(text))
        parts = _PART.findall(text)
        if text and "".join(n + u for n, u in parts) == text:
            return sum((timedelta(**{_UNITS[u]: float(n)}) for n, u in parts), timedelta())
    return None


@_remembered(timedelta)
def format_duration(value: timedelta) -> str:
    """Render a timedelta in the shortest form ``parse_duration`` reads back exactly."""
    total_us = value // timedelta(microseconds=1)
    if total_us == 0:
        return "0s"
    hours, rest = divmod(total_us, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds, rest = divmod(rest, 1_000_000)
    millis, micros = divmod(rest, 1000)
    out = ""
    if hours:
        out += f"{hours}h"
    if minutes:
        out += f"{minutes}m"
    if seconds:
        out += f"{seconds}s"
    if millis:
        out += f"{millis}ms"
    if micros:
        out += f"{micros}us"
    return out
