"""Times as operators type them: ISO-8601, or relative (``1h``, ``2d ago``, ``yesterday``).

``--since 1h`` means "the last hour"; a relative time is counted back from now, in
UTC, the log's zone. A bare number is never a time here: where a command takes a
log position too, digits are the position.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, time, timedelta

from catalog.forms.durations import parse_duration

# Long enough for any real time; a longer argument is a mistake, not a time.
MAX_TIME_TEXT = 64
_DAYS = re.compile(r"(\d{1,5})\s*(d|w)")
DAY_WORDS = ("today", "yesterday")
# A time of day alone (14:45, 14:45:30, 14:45:30.5): today, in the local zone, as `date`
# prints it, which is where an operator copies it from.
_TIME_OF_DAY = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?")


class BadTime(ValueError):
    """Not a time; the message shows the accepted forms."""


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """An ISO-8601 time (UTC when it has no zone), ``now``, ``today``, ``yesterday``
    (midnight UTC), a time of day (``14:45:30``: today, local time, as ``date`` shows
    it), or a duration back from now: ``90s``, ``15m``, ``1h30m``, ``2d``, ``1w``, each
    optionally followed by ``ago``."""
    now = datetime.now(UTC) if now is None else now
    word = text.strip().lower()
    if len(word) > MAX_TIME_TEXT:
        raise BadTime(f"{text[:MAX_TIME_TEXT]!r}... is too long to be a time")
    if word == "now":
        return now
    midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if word == "today":
        return midnight
    if word == "yesterday":
        return midnight - timedelta(days=1)
    clock = _TIME_OF_DAY.fullmatch(word)
    if clock is not None:
        return _today_at(clock, now, text)
    back = _relative(word.removesuffix(" ago").removesuffix("ago").strip())
    if back is not None:
        return now - back
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadTime(
            f"{text!r} is not a time: write an ISO-8601 time such as 2026-11-30T12:00:00Z, "
            "a date, now, today, yesterday, or a duration back from now such as 15m, 1h "
            "or 2d"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _today_at(clock: re.Match[str], now: datetime, text: str) -> datetime:
    hour, minute = int(clock.group(1)), int(clock.group(2))
    second = int(clock.group(3) or 0)
    micro = int((clock.group(4) or "0").ljust(6, "0"))
    try:
        at = time(hour, minute, second, micro)
    except ValueError:
        raise BadTime(
            f"{text!r} is not a time of day: write HH:MM or HH:MM:SS (00:00 to 23:59:59), "
            "which means today in the local time zone"
        ) from None
    # Naive local date and time, then .astimezone(): the zone's rules for that very
    # time (a time before a daylight-saving change today gets that morning's offset).
    today = now.astimezone().date()
    return datetime.combine(today, at).astimezone().astimezone(UTC)


def whole_day(text: str) -> bool:
    """A date alone, ``today`` or ``yesterday``: as an upper bound, the whole day counts."""
    word = text.strip().lower()
    return word in DAY_WORDS or (len(word) == 10 and word[4:5] == "-")


def _relative(word: str) -> timedelta | None:
    if not word or word.replace(".", "", 1).isdigit():
        return None  # digits alone are a log position, or seconds nobody meant
    days = _DAYS.fullmatch(word)
    if days:
        count, unit = int(days.group(1)), days.group(2)
        return timedelta(days=count * (7 if unit == "w" else 1))
    try:
        return parse_duration(word)
    except ValueError:
        return None
