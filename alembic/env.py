"""Alembic environment: runs against a connection handed in by events.database.migrate,
or against the URL in alembic.ini / LLMGW_DATABASE_URL when run as `alembic ...`."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection

from events.database.connection import make_engine
from events.database.tables import Base
import autoscale.tables  # noqa: F401  (registers the autoscaler tables on Base.metadata)
import scheduler.persistence.tables  # noqa: F401  (registers the scheduler tables on Base.metadata)

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = os.environ.get("LLMGW_DATABASE_URL") or config.get_main_option("sqlalchemy.url")
    engine = make_engine(url or "sqlite:///llmgw.db")
    with engine.connect() as conn:
        _run(conn)
        conn.commit()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
