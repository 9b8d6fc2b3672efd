"""`history --since 14:45:30`: a time of day alone is today, in the local zone, as `date`
prints it (issue 24)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.cli.shared.times import BadTime, parse_when


@pytest.fixture
def zone(request: pytest.FixtureRequest) -> Iterator[str]:
    name = str(request.param)
    before = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield name
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Kolkata", "UTC"], indirect=True)
def test_a_time_of_day_is_today_local_time_as_date_shows_it(zone: str) -> None:
    now = datetime(2026, 12, 3, 20, 0, tzinfo=UTC)
    when = parse_when("14:45:30", now)
    # What `date` makes of the same words in the same zone (GNU date: today at that time).
    shown = subprocess.run(
        ["date", "-d", "2026-12-03 14:45:30", "+%s"],
        env={**os.environ, "TZ": zone},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if zone == "Asia/Kolkata":
        # 20:00 UTC is already 4 December there: "today" is the 4th, as `date` says.
        shown = subprocess.run(
            ["date", "-d", "2026-12-04 14:45:30", "+%s"],
            env={**os.environ, "TZ": zone},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    assert when == datetime.fromtimestamp(int(shown), UTC)
    assert parse_when("14:45", now) == when.replace(second=0)
    assert parse_when("9:05:00.5", now).microsecond == 500_000


@pytest.mark.parametrize("zone", ["Europe/Berlin"], indirect=True)
def test_a_time_before_todays_clock_change_takes_that_mornings_offset(zone: str) -> None:
    # 29 March 2026: Berlin moves from UTC+1 to UTC+2 at 02:00 local.
    now = datetime(2026, 3, 29, 12, 0, tzinfo=UTC)
    assert parse_when("01:30", now) == datetime(2026, 3, 29, 0, 30, tzinfo=UTC)
    assert parse_when("12:00", now) == datetime(2026, 3, 29, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize("text", ["24:00", "12:60", "12:00:61", "99:99"])
def test_an_impossible_time_of_day_is_refused_with_the_forms(text: str) -> None:
    with pytest.raises(BadTime, match="HH:MM"):
        parse_when(text, datetime(2026, 12, 3, tzinfo=UTC))


@given(st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_every_time_of_day_is_within_a_day_of_now(h: int, m: int, s: int) -> None:
    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    when = parse_when(f"{h:02d}:{m:02d}:{s:02d}", now)
    assert abs((when - now).total_seconds()) < 2 * 86400
    local = when.astimezone()
    assert (local.hour, local.minute, local.second) == (h, m, s)
