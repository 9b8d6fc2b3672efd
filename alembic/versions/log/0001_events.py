"""The catalog event log.

Revision ID: 0001_events
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from events.database.tables import UTCDateTime

revision: str = "0001_events"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Position = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("position", Position, primary_key=True, autoincrement=False),
        sa.Column("event_id", sa.String(200), nullable=False),
        sa.Column("command_id", sa.String(200), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("schema_version", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(255), nullable=True),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("event_id", name="uq_events_event_id"),
    )
    op.create_index("ix_events_command_id", "events", ["command_id"])
    op.create_index("ix_events_model", "events", ["model"])
    op.create_index("ix_events_recorded_at", "events", ["recorded_at"])


def downgrade() -> None:
    op.drop_table("events")
