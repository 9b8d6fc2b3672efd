"""What every benchmark area shares: timing, tables, the machine, and where caches live.

Each figure is measured in the same run as its reference, and each pair is
interleaved (reference, ours, reference, ours, ...) so that a machine that is
busy for a moment slows both rather than one: the ratio stays honest even when
the absolute numbers wander. The best of the repeats is reported, the usual
choice for throughput on a shared machine (noise only ever adds time).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import structlog

BENCH_DIR = Path(__file__).resolve().parents[1]
REPO = BENCH_DIR.parent
CACHE = BENCH_DIR / ".cache"
PG_HOST = os.environ.get("LLMGW_BENCH_PG", "postgres@127.0.0.1:5432")
PG_ADMIN = f"postgresql://{PG_HOST}/postgres"
T = TypeVar("T")


def pg_url(database: str) -> str:
    return f"postgresql+psycopg://{PG_HOST}/{database}"


def pg_dsn(database: str) -> str:
    return f"postgresql://{PG_HOST}/{database}"


def pg_available() -> str | None:
    """None when the PostgreSQL server answers, else why not (the PG rows then say so)."""
    try:
        with psycopg.connect(PG_ADMIN, connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return f"PostgreSQL not reachable at {PG_HOST} ({exc.__class__.__name__})"


def pg_recreate(database: str) -> None:
    assert database.startswith("llmgw_bench_"), database
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')


def pg_comment(database: str) -> str | None:
    """The stamp a generated database carries (COMMENT ON DATABASE), or None if absent."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            (database,),
        ).fetchone()
    return None if row is None else row[0]


def pg_set_comment(database: str, comment: str) -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"COMMENT ON DATABASE \"{database}\" IS '{comment}'")


def run_fast(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop where it is installed (``pip install -e '.[bench]'``), else on
    asyncio's own loop: the gateway benchmark's figures are uvloop's, and the tests of its
    parts run in the lean ``.[dev]`` environment all the same."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def clock() -> float:
    return time.perf_counter()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds one call takes, after a full collection so earlier garbage is not billed here."""
    gc.collect()
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def best_of(repeats: int, *fns: Callable[[], Any]) -> list[float]:
    """Interleave the callables ``repeats`` times; the best seconds of each, in order."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            seconds, _ = timed(fn)
            best[i] = min(best[i], seconds)
    return best


def rate(count: float, seconds: float) -> str:
    if seconds <= 0:
        return "-"
    value = count / seconds
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:,.1f}"


def ms(seconds: float) -> str:
    if seconds < 0.01:
        return f"{seconds * 1000:.2f} ms"
    if seconds < 10:
        return f"{seconds * 1000:,.0f} ms"
    return f"{seconds:,.1f} s"


def ratio(ours: float, reference: float) -> str:
    if reference == 0:
        return "-"
    return f"{ours / reference:.2f}x"


@dataclass
class Table:
    """One markdown table: what a bench area prints, and what BENCHMARKS.md holds."""

    title: str
    columns: Sequence[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def note(self, text: str) -> None:
        self.notes.append(text)

    def render(self) -> str:
        widths = [len(c) for c in self.columns]
        for row in self.rows:
            for i, cell in enumerate(row):
                widths[i] = max(widths[i], len(cell))

        def line(cells: Sequence[str]) -> str:
            padded = (
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            return "| " + " | ".join(padded) + " |"

        sep = (
            "|"
            + "|".join(
                ("-" * (w + 2)) if i == 0 else ("-" * (w + 1) + ":") for i, w in enumerate(widths)
            )
            + "|"
        )
        out = [f"### {self.title}", "", line(self.columns), sep]
        out.extend(line(r) for r in self.rows)
        if self.notes:
            out.append("")
            out.extend(f"- {n}" for n in self.notes)
        return "\n".join(out) + "\n"


def emit(table: Table) -> None:
    print(table.render(), flush=True)


def progress(message: str) -> None:
    """Progress goes to stderr so that stdout holds only the tables."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def machine() -> str:
    """One line about where the numbers were measured."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            mem_kb = int(handle.readline().split()[1])
        mem = f"{mem_kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        mem = "?"
    import sqlite3

    import pydantic
    import sqlalchemy

    pg = "-"
    if pg_available() is None:
        with psycopg.connect(PG_ADMIN) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            pg = str(row[0]) if row else "?"
    commit = "?"
    with contextlib.suppress(OSError):
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem}; Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}, PostgreSQL {pg}, SQLAlchemy {sqlalchemy.__version__}, "
        f"pydantic {pydantic.__version__}; commit {commit}"
    )


def quiet_logs() -> None:
    """The catalog logs every skipped event and every append; a benchmark must not pay
    for printing them (nor drown its tables in them)."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
        cache_logger_on_first_use=True,
    )
