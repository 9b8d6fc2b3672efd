"""Running the Alembic migrations from code: the only way the schema is created or changed."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from events.database.connection import WRITE

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic (and Mako, which it loads) is imported only when a migration has to
# run: every command checks the schema, and loading them costs about a third
# of a command's start-up. SCHEMA_HEAD is what this code expects; a test keeps
# it equal to the migrations' head.
SCHEMA_HEAD = frozenset({"0024_rounds_by_reference"})

# The migrations live at the project root (alembic/), beside the packages.
MIGRATIONS = Path(__file__).resolve().parents[2] / "alembic"


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    # versions/ holds a folder per area (log, tenants, scheduler): one history, one chain.
    config.set_main_option("recursive_version_locations", "true")
    # ConfigParser interpolation would read a '%' in a password as syntax.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def head_revisions() -> frozenset[str]:
    """The newest revision of each branch (one, unless two lines of work are not yet merged)."""
    from alembic.script import ScriptDirectory

    return frozenset(ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads())


def head_revision() -> str | None:
    return ",".join(sorted(head_revisions())) or None


def current_revisions(engine: Engine) -> frozenset[str]:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return frozenset(MigrationContext.configure(conn).get_current_heads())


def current_revision(engine: Engine) -> str | None:
    stamped = _stamped(engine)
    if stamped:
        return ",".join(sorted(stamped))
    return ",".join(sorted(current_revisions(engine))) or None


def is_at_head(engine: Engine) -> bool:
    # The stamp read without Alembic first: ``/readyz`` asks on every probe, and
    # Alembic's answer parses every migration script (7 ms of CPU a call).
    if _stamped(engine) == SCHEMA_HEAD:
        return True
    return current_revisions(engine) == head_revisions()


# pg advisory lock key held while migrating ("llmgw-migrate").
MIGRATION_LOCK_KEY = 0x6C6C6D6777_4D49


def upgrade(engine: Engine, revision: str = "heads") -> None:
    """Bring the schema to ``revision``, on the given engine's database.

    Many processes may meet a brand-new database at once (four ``llmgw add``
    started together): each migrates holding a database-wide lock taken
    before Alembic reads the current revision (SQLite: ``BEGIN IMMEDIATE``;
    PostgreSQL: a transaction-level advisory lock), so one migrates and the
    others, once they hold the lock, find the schema at head and do nothing.
    Without it two would create the same tables, or a deferred SQLite
    transaction would fail with "database is locked" upgrading its read lock.
    """
    from alembic import command

    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, revision)


class UnknownSchema(Exception):
    """The database is at a schema revision this code does not know."""


def ensure_schema(engine: Engine) -> None:
    """Migrate an empty or older database on first use; a no-op when already at head.

    A database stamped with a revision this code has never heard of was
    written by a newer release (or a development branch): refuse to touch it
    rather than guess, and say so.
    """
    if _stamped(engine) == SCHEMA_HEAD:
        return
    from alembic.script import ScriptDirectory

    current = current_revisions(engine)
    if current == head_revisions():
        return
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    known = {rev.revision for rev in script.walk_revisions()}
    unknown = sorted(current - known)
    if unknown:
        raise UnknownSchema(
            f"the database's schema is at revision {', '.join(unknown)}, which this version "
            "of llmgw does not know: it was written by a newer release. Upgrade llmgw, or "
            "point --db at another database"
        )
    upgrade(engine)


def _stamped(engine: Engine) -> frozenset[str] | None:
    """The revisions stamped in the database, read without Alembic; None if there are none."""
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars()
            return frozenset(rows)
    except DBAPIError:  # no alembic_version table: an empty database
        return None
