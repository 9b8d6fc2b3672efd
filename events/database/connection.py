"""Connecting to the store: SQLite by default, PostgreSQL for several control-plane replicas.

Each back end gets the settings that make the log's guarantees hold on it:

- SQLite runs in WAL mode (readers never block the writer), with a busy
  timeout, and a write transaction starts with ``BEGIN IMMEDIATE``. A deferred
  transaction that reads and then writes can fail with "database is locked"
  when it tries to upgrade its lock; taking the write lock up front means two
  writers queue instead of deadlocking.
- PostgreSQL takes a table lock inside each append (see events.storage.sql_log).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url

from events.database.sqlite_text import TolerantConnection

SQLITE_BUSY_TIMEOUT_MS = 30_000
WRITE = "llmgw_write"  # execution option: this transaction will write


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url`` with this project's per-back-end settings."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        # Text that is not UTF-8 is read as bytes, not a failed read (events.database.sqlite_text).
        kwargs["connect_args"] = {"factory": TolerantConnection, **kwargs.get("connect_args", {})}
        engine = create_engine(url, **kwargs)
        _configure_sqlite(engine)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


# A transaction left idle this long is ended by PostgreSQL. Long enough for any pause of a
# healthy process between two statements of one transaction; short enough that a process
# frozen mid-transaction (SIGSTOP, a partition) does not hold its row and table locks,
# and with them every other replica's writes, for more than a few seconds.
IDLE_IN_TRANSACTION_S = 5.0


# How long the *server* keeps sending to a process that reads nothing before it drops
# the connection (its own socket's TCP_USER_TIMEOUT, set per session). A backend blocked
# writing a result to a frozen process is "active", not idle: neither the
# idle-in-transaction timeout nor a statement timeout ends it (PostgreSQL cannot cancel
# a statement in the middle of a message), and the frozen process's kernel still answers
# the window probes, so no keepalive fails either. It held its locks (the lease row FOR
# SHARE, a replica's fenced round) for as long as the process stayed stopped. Linux
# (5.11 and later) counts zero-window probing against this timeout.
STALLED_READER_S = 2 * IDLE_IN_TRANSACTION_S


def _server_options(idle_ms: int, stalled_ms: int, statement_ms: int | None = None) -> str:
    options = [
        f"-c idle_in_transaction_session_timeout={idle_ms}",
        f"-c tcp_user_timeout={stalled_ms}",
    ]
    if statement_ms is not None:
        options[:0] = [f"-c statement_timeout={statement_ms}", f"-c lock_timeout={statement_ms}"]
    return " ".join(options)


def session_connect_args() -> dict[str, Any]:
    """libpq settings for every connection the command line and ``llmgw serve`` open:
    TCP keepalives (a dead peer noticed in about 10 s, not the kernel's two hours),
    ``IDLE_IN_TRANSACTION_S`` and, on the server's side, ``STALLED_READER_S``."""
    return {
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "options": _server_options(int(IDLE_IN_TRANSACTION_S * 1000), int(STALLED_READER_S * 1000)),
    }


def bounded_connect_args(bound_s: float) -> dict[str, Any]:
    """libpq settings for connections that must never hang longer than about ``bound_s``
    (the scheduler leader's, bounded by its leadership lease).

    Keepalives notice a dead peer within about the bound; a statement, a wait for a
    lock, a transaction left idle (its process frozen mid-write) and a result the
    process stopped reading (frozen mid-read: the server's own ``tcp_user_timeout``)
    end within it, so none of them can hold a row or a table lock past it.
    """
    ms = max(1000, int(bound_s * 1000))
    return {
        "keepalives": 1,
        "keepalives_idle": max(1, int(bound_s / 2)),
        "keepalives_interval": 1,
        "keepalives_count": 3,
        "tcp_user_timeout": ms,
        "connect_timeout": max(2, int(bound_s)),
        "options": _server_options(max(1000, ms // 2), ms, statement_ms=ms),
    }


def bounded_engine(url: str, bound_s: float) -> Engine:
    """An engine whose connections are bounded (``bounded_connect_args``) on PostgreSQL;
    on SQLite, an engine like any other (its waits are bounded by the busy timeout)."""
    if make_url(url).get_backend_name() == "sqlite":
        return make_engine(url)
    return make_engine(url, connect_args=bounded_connect_args(bound_s), pool_size=2)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event, below, issue BEGIN itself: the
        # driver's own implicit transactions cannot be made IMMEDIATE.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        # The busy timeout first: switching a brand-new file to WAL needs a lock
        # that another process starting at the same moment may hold.
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode=WAL")
        # FULL: an acknowledged add survives a power loss, not only a crash.
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def sqlite_path(url: str) -> Path | None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    return Path(parsed.database)
