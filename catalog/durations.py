"""Durations as operators write them: ``90s``, ``20m``, ``1h30m``, or plain seconds.

The Go control plane this ports accepted Go duration strings, so existing
configuration keeps working; a bare number is taken as seconds because that is
what every YAML author reaches for first.
"""

from __future__ import annotations

import re
from datetime import timedelta

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def parse_duration(value: object) -> timedelta:
    """Turn a duration as written in YAML or JSON into a timedelta.

    Raises ValueError with the accepted forms, so the catalog's refusal can
    quote it to the operator.
    """
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; write e.g. 90s, 20m, 1h30m or seconds")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"duration {value} is negative")
        return timedelta(seconds=value)
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            return timedelta(seconds=float(text))
        parts = _PART.findall(text)
        if text and "".join(n + u for n, u in parts) == text:
            return timedelta(seconds=sum(float(n) * _UNIT_SECONDS[u] for n, u in parts))
    raise ValueError(f"{value!r} is not a duration; write e.g. 90s, 20m, 1h30m or seconds")


def format_duration(value: timedelta) -> str:
    """Render a timedelta in the shortest form ``parse_duration`` reads back exactly."""
    total_ms = round(value.total_seconds() * 1000)
    if total_ms == 0:
        return "0s"
    hours, rest = divmod(total_ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    out = ""
    if hours:
        out += f"{hours}h"
    if minutes:
        out += f"{minutes}m"
    if seconds:
        out += f"{seconds}s"
    if millis:
        out += f"{millis}ms"
    return out
