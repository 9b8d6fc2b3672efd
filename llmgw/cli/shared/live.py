"""Commands that keep going: ``--watch`` redraws a view, ``--follow`` appends to one, and a
progress line tells an operator at a terminal that a slow command is still working.

Ctrl-C ends a watch or a follow with exit status 0 and no traceback: it is how
an operator says "enough", not a failure. Every value still goes through
``shown`` (the views' tables) and the guarded stdout (llmgw.cli.shared.context); only
the screen-clearing sequence of a watch on a terminal bypasses the guard, since
it is the one control sequence this module means to send.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

from llmgw.cli.shared.context import print_json

# Home the cursor, then clear the screen: what watch(1) does between refreshes.
CLEAR = "\x1b[H\x1b[2J"
# A progress line appears only after this long: a quick command prints nothing at all.
PROGRESS_AFTER_S = 0.5


def _raw(stream: TextIO) -> TextIO:
    """The terminal under the guarded stream (llmgw.cli.shared.context.GuardedStream)."""
    inner: TextIO = getattr(stream, "_stream", stream)
    return inner


def json_line(data: Any) -> str:
    """One JSON document on one line (JSON lines: a program reads a refresh a line)."""
    return json.dumps(data, separators=(",", ":"), default=str) + "\n"


def show(
    view: Callable[[], tuple[Any, str]],
    *,
    watch: float | None,
    as_json: bool,
    title: str,
) -> int:
    """Print ``view()`` once, or every ``watch`` seconds until Ctrl-C.

    ``view`` returns the JSON document and the text for people. Watched with
    --json, each refresh is one line; on a terminal the screen is redrawn, else
    each refresh follows the last under a line with its time.
    """
    if watch is None:
        data, text = view()
        if as_json:
            print_json(data)
        else:
            sys.stdout.write(text)
        return 0
    out = sys.stdout
    terminal = out.isatty()
    try:
        while True:
            data, text = view()
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            if as_json:
                out.write(json_line(data))
            else:
                if terminal:
                    _raw(out).write(CLEAR)
                out.write(f"every {watch:g}s: {title}  {stamp}\n\n{text}")
                if not terminal:
                    out.write("\n")
            out.flush()
            time.sleep(watch)
    except KeyboardInterrupt:
        return 0


def watch_seconds(text: str) -> float:
    """``--watch``'s value: seconds (2, 0.5) or a duration (5s, 1m); at least 0.1 s."""
    import argparse

    from catalog.forms.durations import parse_duration

    try:
        seconds = parse_duration(float(text) if _number(text) else text).total_seconds()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds < 0.1:
        raise argparse.ArgumentTypeError(f"{text!r} is too short: at most ten refreshes a second")
    return seconds


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@contextmanager
def progress(what: str, stream: TextIO | None = None) -> Iterator[None]:
    """While the body runs, ``what`` and the seconds elapsed on one stderr line, redrawn in
    place, then erased; only when stderr is a terminal, and only after half a second.

    Without a terminal (a pipe, a log file, the tests) nothing is written: the
    output a program reads stays exactly what the command prints.
    """
    # The raw stream: the guard would escape the carriage returns that redraw the line.
    err = _raw(stream if stream is not None else sys.stderr)
    if not err.isatty():
        yield
        return
    done = threading.Event()
    start = time.monotonic()
    shown_line = threading.Event()

    def tick() -> None:
        if done.wait(PROGRESS_AFTER_S):
            return
        while not done.is_set():
            err.write(f"\r{what}... {time.monotonic() - start:.0f}s")
            err.flush()
            shown_line.set()
            done.wait(1.0)

    ticker = threading.Thread(target=tick, name="llmgw-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        if shown_line.is_set():
            # Erase the line (carriage return, spaces, carriage return): no escape sequence.
            width = len(what) + 12
            err.write("\r" + " " * width + "\r")
            err.flush()
