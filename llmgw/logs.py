"""Structured logs: one event per thing that happened, with a stable name and fields.

JSON lines when stderr is not a terminal (for collectors and grep), readable
key=value lines when a person is watching.

Configured once per process, by the command that runs (``llmgw.cli``). Each module's
``structlog.get_logger`` proxy assembles its bound logger on first use and keeps it
(``cache_logger_on_first_use``): without that, every call built a new logger, printer
and wrapper before filtering (``python -m bench.logcall``). The price is that a second
``configure`` in the same process does not reach loggers already used; tests do not
configure (they read logs with ``structlog.testing.capture_logs``, or from a process's
stderr), and ``cache=False`` is there for one that must.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import sys
from typing import Any, TextIO

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


def configure(
    default_level: str = "WARNING", *, cache: bool = True, buffered: bool = False
) -> None:
    """``buffered``: JSON lines written together (``BufferedLines``), for a process that
    logs a line per request; a terminal's readable lines are always written at once."""
    level_name = os.environ.get("LLMGW_LOG_LEVEL", default_level).upper()
    level = logging.getLevelNamesMapping().get(level_name, logging.WARNING)
    tty = sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=False)
        if tty
        else structlog.processors.JSONRenderer(sort_keys=True)
    )
    factory: Any = (
        BufferedLines(sys.__stderr__ or sys.stderr)
        if buffered and not tty
        else structlog.PrintLoggerFactory(file=sys.stderr)
    )
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
