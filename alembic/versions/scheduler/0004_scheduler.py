"""The scheduler: node inventory, placements, placement rounds and their audit trail.

Revision ID: 0004_scheduler
Revises: 0003_snapshots
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from events.database.tables import UTCDateTime

revision: str = "0004_scheduler"
down_revision: str | None = "0003_snapshots"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Position = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("gpu_class", sa.String(64), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpus_reserved", sa.Integer(), nullable=False),
        sa.Column("memory_gb", sa.Float(), nullable=True),
        sa.Column("labels", sa.Text(), nullable=False),
        sa.Column("fabric", sa.String(255), nullable=True),
        sa.Column("reported_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "placements",
        sa.Column("model", sa.String(255), primary_key=True),
        sa.Column("replica", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("profile", sa.String(255), nullable=False),
        sa.Column("nodes", sa.Text(), nullable=False),
        sa.Column("gpus_per_node", sa.Integer(), nullable=False),
        sa.Column("gpu_class", sa.String(64), nullable=True),
        sa.Column("memory_gb_per_node", sa.Integer(), nullable=False),
        sa.Column("round_id", Position, nullable=False),
        sa.Column("placed_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "placement_rounds",
        sa.Column("id", Position, primary_key=True, autoincrement=False),
        sa.Column("planned_at", UTCDateTime(), nullable=False),
        sa.Column("catalog_position", Position, nullable=False),
        sa.Column("inventory_digest", sa.String(64), nullable=False),
        sa.Column("reported_at", sa.Text(), nullable=False),
        sa.Column("current", sa.Text(), nullable=False),
        sa.Column("policy", sa.Text(), nullable=False),
        sa.Column("placed", sa.Integer(), nullable=False),
        sa.Column("removed", sa.Integer(), nullable=False),
        sa.Column("unplaced", sa.Integer(), nullable=False),
    )
    op.create_index("ix_placement_rounds_planned_at", "placement_rounds", ["planned_at"])
    op.create_table(
        "inventories",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("nodes", sa.Text(), nullable=False),
    )
    op.create_table(
        "placement_events",
        sa.Column("position", Position, primary_key=True, autoincrement=False),
        sa.Column("round_id", Position, nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("replica", sa.Integer(), nullable=False),
        sa.Column("profile", sa.String(255), nullable=False),
        sa.Column("nodes", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("catalog_position", Position, nullable=False),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_placement_events_round_id", "placement_events", ["round_id"])
    op.create_index("ix_placement_events_model", "placement_events", ["model"])
    op.create_index("ix_placement_events_recorded_at", "placement_events", ["recorded_at"])


def downgrade() -> None:
    op.drop_table("placement_events")
    op.drop_table("inventories")
    op.drop_table("placement_rounds")
    op.drop_table("placements")
    op.drop_table("nodes")
