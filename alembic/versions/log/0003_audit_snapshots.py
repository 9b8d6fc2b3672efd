"""Snapshots of the catalog's replay state, for fast start-up (events.read.snapshots).

Revision ID: 0003_snapshots
Revises: 0002_event_hash_chain
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from events.database.tables import UTCDateTime

revision: str = "0003_snapshots"
down_revision: str | None = "0002_event_hash_chain"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Position = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "catalog_snapshots",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("position", Position, nullable=False),
        sa.Column("event_hash", sa.String(64), nullable=True),
        sa.Column("declared_digest", sa.String(64), nullable=False),
        sa.Column("code_version", sa.String(255), nullable=False),
        sa.Column("applied_count", sa.Integer(), nullable=False),
        sa.Column("skipped_count", sa.Integer(), nullable=False),
        sa.Column("model_count", sa.Integer(), nullable=False),
        sa.Column("models", sa.Text(), nullable=False),
        sa.Column("checksum", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_index(
        "ix_catalog_snapshots_declared_digest", "catalog_snapshots", ["declared_digest"]
    )


def downgrade() -> None:
    op.drop_table("catalog_snapshots")
