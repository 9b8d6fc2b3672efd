"""Replica lifecycle: replica states, cordons and drains, failures and their back-off.

Revision ID: 0005_lifecycle
Revises: 0004_scheduler
Create Date: 2026-12-03

Every column added to an existing table has a server default, so rows written
before it (and rows written by an older release during a rolling upgrade) read
as what they were: a placement never reported on, by an agent that does not
report replicas, placed with no recorded fingerprint.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from events.database.tables import UTCDateTime

revision: str = "0005_lifecycle"
down_revision: str | None = "0004_scheduler"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.add_column(sa.Column("state", sa.String(16), nullable=False, server_default="placed"))
        batch.add_column(sa.Column("state_since", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("message", sa.Text(), nullable=False, server_default=""))
        batch.add_column(sa.Column("endpoint", sa.String(2048), nullable=True))
        batch.add_column(sa.Column("fingerprint", sa.String(64), nullable=False, server_default=""))
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(
            sa.Column("reports_replicas", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("placement_events") as batch:
        batch.add_column(sa.Column("actor", sa.String(255), nullable=False, server_default=""))
    with op.batch_alter_table("placement_rounds") as batch:
        batch.add_column(sa.Column("lifecycle", sa.Text(), nullable=True))
    op.create_table(
        "node_cordons",
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("since", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "replica_failures",
        sa.Column("model", sa.String(255), primary_key=True),
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_failed_at", UTCDateTime(), nullable=False),
        sa.Column("last_reason", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("replica_failures")
    op.drop_table("node_cordons")
    with op.batch_alter_table("placement_rounds") as batch:
        batch.drop_column("lifecycle")
    with op.batch_alter_table("placement_events") as batch:
        batch.drop_column("actor")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("reports_replicas")
    with op.batch_alter_table("placements") as batch:
        for column in ("fingerprint", "endpoint", "message", "state_since", "state"):
            batch.drop_column(column)
