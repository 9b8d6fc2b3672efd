"""Running the Alembic migrations from code: the only way the schema is created or changed."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from alembic import command

# The migrations live at the project root (alembic/), beside the packages.
MIGRATIONS = Path(__file__).resolve().parent.parent / "alembic"


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    # ConfigParser interpolation would read a '%' in a password as syntax.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def head_revisions() -> frozenset[str]:
    """The newest revision of each branch (one, unless two lines of work are not yet merged)."""
    return frozenset(ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads())


def head_revision() -> str | None:
    return ",".join(sorted(head_revisions())) or None


def current_revisions(engine: Engine) -> frozenset[str]:
    with engine.connect() as conn:
        return frozenset(MigrationContext.configure(conn).get_current_heads())


def current_revision(engine: Engine) -> str | None:
    return ",".join(sorted(current_revisions(engine))) or None


def is_at_head(engine: Engine) -> bool:
    return current_revisions(engine) == head_revisions()


def upgrade(engine: Engine, revision: str = "heads") -> None:
    """Bring the schema to ``revision``, on the given engine's database."""
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str) -> None:
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
