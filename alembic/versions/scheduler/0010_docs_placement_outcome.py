"""The scheduler's last unplaced replicas and their reasons: table ``placement_outcome``.

Revision ID: 0010_docs_placement_outcome
Revises: 0009_rollout_versions
Create Date: 2026-12-04

``GET /v1/fleet`` planned a round on every request to say why replicas were
unplaced. The daemon now writes what its last round left unplaced, with the
reasons, whenever that changes (one row, replaced whole), and the API reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from events.database.tables import Position, UTCDateTime

revision: str = "0010_docs_placement_outcome"
down_revision: str | Sequence[str] | None = "0009_rollout_versions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "placement_outcome",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("planned_at", UTCDateTime(), nullable=False),
        sa.Column("catalog_position", Position, nullable=False),
        sa.Column("round_id", Position, nullable=False),
        sa.Column("unplaced", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("placement_outcome")
