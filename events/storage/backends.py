"""Opening the log of a database: the back end's own implementation of ``Log``."""

from __future__ import annotations

from sqlalchemy import Engine

from events.storage.postgres_log import PostgresLog
from events.storage.sql_log import SqlLog
from events.storage.sqlite_log import SqliteLog


def open_log(engine: Engine) -> SqlLog:
    """The log stored in ``engine``'s database (SQLite or PostgreSQL)."""
    name = engine.dialect.name
    if name == "sqlite":
        return SqliteLog(engine)
    if name == "postgresql":
        return PostgresLog(engine)
    raise ValueError(f"no event log for the {name!r} back end: use SQLite or PostgreSQL")
