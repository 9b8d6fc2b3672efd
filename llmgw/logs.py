"""Structured logs: one event per thing that happened, with a stable name and fields.

JSON lines when stderr is not a terminal (for collectors and grep), readable
key=value lines when a person is watching.

Configured once per process, by the command that runs (``llmgw.cli``). Each module's
``structlog.get_logger`` proxy assembles its bound logger on first use and keeps it
(``cache_logger_on_first_use``): without that, every call built a new logger, printer
and wrapper before filtering (``python -m bench.api.logcall``). The price is that a second
``configure`` in the same process does not reach loggers already used; tests do not
configure (they read logs with ``structlog.testing.capture_logs``, or from a process's
stderr), and ``cache=False`` is there for one that must.
"""

from __future__ import annotations

import asyncio
import atexit
import datetime
import importlib.util
import json
import logging
import os
import sys
import time
from typing import Any, TextIO

import msgspec
import structlog

# How long a line may wait in ``buffered`` mode before it is written.
FLUSH_S = 0.02


class BufferedLines:
    """A logger factory (and its one logger) that writes JSON lines to ``stream`` together.

    A line per request through the gateway was one ``write`` system call per request
    (stderr is line-buffered), about a tenth of its CPU per request under load
    (py-spy, ``docs/benchmarks/gateway-side-by-side.md``). Here lines logged while an event
    loop runs wait up to ``FLUSH_S`` and go out in one write; with no loop running (a
    command's start, a supervisor) a line is written at once. ``flush`` writes what
    waits; it runs at exit, and a process that leaves by ``os._exit`` calls it first
    (``structlog.get_config()["logger_factory"].flush``).

    The lines are JSON with every character outside printable ASCII escaped (``json``'s
    ``ensure_ascii``: control characters and DEL included), so they are written to the
    process's own stderr, not through the CLI's terminal guard
    (``llmgw.cli.shared.context.GuardedStream``), whose character-by-character check was another
    5% of a request.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.parts: list[str] = []
        self.scheduled = False
        atexit.register(self.flush)

    def __call__(self, *args: Any) -> BufferedLines:
        return self

    def msg(self, message: str) -> None:
        self.parts.append(message)
        if self.scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self.scheduled = True
        loop.call_later(FLUSH_S, self.flush)

    log = debug = info = warn = warning = error = err = critical = exception = fatal = msg

    def flush(self) -> None:
        self.scheduled = False
        if not self.parts:
            return
        data = "\n".join(self.parts) + "\n"
        self.parts.clear()
        try:
            self.stream.write(data)
            self.stream.flush()
        except (OSError, ValueError):  # stderr closed or gone: nothing to report it to
            pass


def _fallback(value: Any) -> Any:
    """A value JSON has no form for, as structlog's JSONRenderer shows it."""
    custom = getattr(value, "__structlog__", None)
    return custom() if callable(custom) else repr(value)


class JSONLines:
    """The processors of a ``buffered`` process's JSON lines in one step: level,
    timestamp (ISO 8601, UTC, always with microseconds), an exception's traceback as
    text, and the line with sorted keys, as structlog's ``add_log_level``,
    ``TimeStamper(fmt="iso", utc=True)``, ``format_exc_info`` and
    ``JSONRenderer(sort_keys=True)`` make it.

    Why: the gateway logs a line per request, and that chain cost 18 us of the line's
    CPU (about a tenth of a request's): ``json.dumps`` with sorted keys, and a
    ``datetime`` made and formatted per line. Here msgspec encodes the line (0.8 us)
    and the timestamp's seconds are formatted once per second. A line msgspec would
    write with a byte outside printable ASCII (text that is not ASCII, DEL), or cannot
    encode (a lone surrogate), is written by ``json.dumps`` as before, every such
    character escaped: these lines go to stderr unguarded (see ``BufferedLines``).
    """

    def __init__(self) -> None:
        self._encoder = msgspec.json.Encoder(order="sorted", enc_hook=_fallback)
        self._second = -1
        self._prefix = ""

    def __call__(self, logger: Any, method: str, event: Any) -> str:
        event = structlog.processors.add_log_level(logger, method, event)
        now = time.time()
        second = int(now)
        if second != self._second:
            self._prefix = datetime.datetime.fromtimestamp(second, datetime.UTC).strftime(
                "%Y-%m-%dT%H:%M:%S."
            )
            self._second = second
        event["timestamp"] = f"{self._prefix}{int((now - second) * 1e6):06d}Z"
        if "exc_info" in event:
            event = structlog.processors.format_exc_info(logger, method, event)
        try:
            line = self._encoder.encode(event)
        except Exception:
            line = b"\x7f"  # whatever msgspec refuses, json.dumps renders
        if line.isascii() and b"\x7f" not in line:
            return line.decode("ascii")
        return json.dumps(event, sort_keys=True, default=_fallback, separators=(",", ":"))


def _traceback_formatter() -> structlog.typing.ExceptionRenderer:
    """A terminal's tracebacks without the frames' local values: structlog's default
    (rich's, or better_exceptions') prints them, and a local may be a secret (an
    engine's key on its way into a request's head, gateway.upstream)."""
    if importlib.util.find_spec("rich") is not None:
        return structlog.dev.RichTracebackFormatter(show_locals=False)
    return structlog.dev.plain_traceback


def configure(
    default_level: str = "WARNING", *, cache: bool = True, buffered: bool = False
) -> None:
    """``buffered``: JSON lines written together (``BufferedLines``), for a process that
    logs a line per request; a terminal's readable lines are always written at once."""
    level_name = os.environ.get("LLMGW_LOG_LEVEL", default_level).upper()
    level = logging.getLevelNamesMapping().get(level_name, logging.WARNING)
    tty = sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=False, exception_formatter=_traceback_formatter())
        if tty
        else structlog.processors.JSONRenderer(sort_keys=True)
    )
    factory: Any = (
        BufferedLines(sys.__stderr__ or sys.stderr)
        if buffered and not tty
        else structlog.PrintLoggerFactory(file=sys.stderr)
    )
    if buffered and not tty:
        structlog.configure(
            processors=[JSONLines()],
            wrapper_class=structlog.make_filtering_bound_logger(level),
            logger_factory=factory,
            cache_logger_on_first_use=cache,
        )
        return
    # A JSON line carries an exception's traceback as text ("exception"); without this
    # step ``log.exception`` wrote only ``"exc_info": true``, and a gateway's 500 said
    # "see its log" of a log that did not say what failed. The console renderer formats
    # tracebacks itself.
    exceptions: list[structlog.typing.Processor] = (
        [] if tty else [structlog.processors.format_exc_info]
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *exceptions,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=factory,
        cache_logger_on_first_use=cache,
    )
