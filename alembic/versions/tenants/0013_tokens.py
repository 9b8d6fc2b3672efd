"""Bearer tokens in the database, and a notification on PostgreSQL for every append.

Revision ID: 0013_tokens
Revises: 0012_placement_moves
Create Date: 2026-12-07

``tokens`` holds the tokens `llmgw token new` issues and `llmgw token import` moves in
from an auth file: name, role, scope and SHA-256, never the token (events.database.tables
.TokenRow). On PostgreSQL, a statement trigger on ``events`` and on ``placement_events``
sends ``NOTIFY llmgw_changes`` with the table's name, delivered when the writing
transaction commits, whoever wrote (a replica, the CLI, the scheduler): every replica
LISTENs (llmgw.api.runtime.changes) and wakes its event streams and its token check at
once rather than at its next poll. SQLite has no such thing; nothing changes there.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0013_tokens"
down_revision: str | Sequence[str] | None = "0012_placement_moves"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The channel every replica listens on (llmgw.api.runtime.changes.CHANNEL).
CHANNEL = "llmgw_changes"
NOTIFIED = ("events", "placement_events")


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("nodes", sa.Text(), nullable=False, server_default="[]"),
        sa.Column("models", sa.Text(), nullable=False, server_default="[]"),
        sa.Column("issued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("issued_by", sa.String(255), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_by", sa.String(255), nullable=True),
        sa.Column("revision", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.UniqueConstraint("sha256", name="uq_tokens_sha256"),
    )
    op.create_index("ix_tokens_revision", "tokens", ["revision"])
    op.create_index(
        "uq_tokens_active_name",
        "tokens",
        ["name"],
        unique=True,
        sqlite_where=sa.text("revoked_at IS NULL"),
        postgresql_where=sa.text("revoked_at IS NULL"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION llmgw_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN PERFORM pg_notify('{CHANNEL}', TG_TABLE_NAME); RETURN NULL; END $$"
        )
        for table in NOTIFIED:
            op.execute(
                f"CREATE TRIGGER llmgw_notify_{table} AFTER INSERT ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION llmgw_notify_change()"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in NOTIFIED:
            op.execute(f"DROP TRIGGER IF EXISTS llmgw_notify_{table} ON {table}")
        op.execute("DROP FUNCTION IF EXISTS llmgw_notify_change()")
    op.drop_index("uq_tokens_active_name", table_name="tokens")
    op.drop_index("ix_tokens_revision", table_name="tokens")
    op.drop_table("tokens")
