"""The pieces of llmgw.cli.shared.live that need no process: the progress line (on a terminal only),
--watch's value, and JSON lines. The commands themselves: tests/e2e/test_cli_live.py."""

from __future__ import annotations

import argparse
import io
import json
import time

import pytest

from llmgw.cli.shared import live


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_progress_line_is_drawn_on_a_terminal_then_erased(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(live, "PROGRESS_AFTER_S", 0.0)
    err = Terminal()
    with live.progress("replaying the log", err):
        deadline = time.monotonic() + 30
        while "replaying the log..." not in err.getvalue():  # drawn by the ticker thread
            assert time.monotonic() < deadline
            time.sleep(0.01)
    written = err.getvalue()
    assert written.startswith("\rreplaying the log... 0s")
    # Erased with spaces, no escape sequence: the terminal is left as it was.
    assert written.endswith("\r" + " " * (len("replaying the log") + 12) + "\r")
    assert "\x1b" not in written


def test_without_a_terminal_nothing_is_written() -> None:
    err = io.StringIO()
    with live.progress("replaying the log", err):
        pass
    assert err.getvalue() == ""


def test_a_quick_command_draws_no_progress_line() -> None:
    err = Terminal()
    with live.progress("replaying the log", err):
        pass  # done long before PROGRESS_AFTER_S
    assert err.getvalue() == ""


@pytest.mark.parametrize(
    ("text", "seconds"), [("2", 2.0), ("0.5", 0.5), ("5s", 5.0), ("1m", 60.0), ("200ms", 0.2)]
)
def test_watch_takes_seconds_or_a_duration(text: str, seconds: float) -> None:
    assert live.watch_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0", "50ms", "-1", "soon", "nan"])
def test_watch_refuses_what_is_not_a_sensible_refresh(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        live.watch_seconds(text)


def test_a_json_line_is_one_document_on_one_line() -> None:
    data = [{"name": "a\nb", "labels": {"zone": "eu"}}]
    line = live.json_line(data)
    assert line.count("\n") == 1 and line.endswith("\n")
    assert json.loads(line) == data
