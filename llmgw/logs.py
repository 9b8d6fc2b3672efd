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

import logging
import os
import sys

import structlog


def configure(default_level: str = "WARNING", *, cache: bool = True) -> None:
    level_name = os.environ.get("LLMGW_LOG_LEVEL", default_level).upper()
    level = logging.getLevelNamesMapping().get(level_name, logging.WARNING)
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=False)
        if sys.stderr.isatty()
        else structlog.processors.JSONRenderer(sort_keys=True)
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=cache,
    )
