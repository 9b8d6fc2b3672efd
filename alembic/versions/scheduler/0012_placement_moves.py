"""Defragmentation and spread repair move replicas surge-first: two columns on placements.

Revision ID: 0012_placement_moves
Revises: 0011_llamacpp_context
Create Date: 2026-12-04

``moving`` is non-empty while a replica is being moved (``scheduler.planner.defrag``):
why, in the operator's words ("to make room for model X, profile P on node N"). Its
copy already runs elsewhere; the round stops it once its model has all its wanted
replicas ready without it. ``moving_for`` names the model the move makes room for
("" for a spread repair): the node it leaves is kept for that model meanwhile. Kept on
the placement, not only in the round's record, because the move spans rounds.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0012_placement_moves"
down_revision: str | Sequence[str] | None = "0011_llamacpp_context"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.add_column(sa.Column("moving", sa.Text(), nullable=False, server_default=""))
        batch.add_column(sa.Column("moving_for", sa.String(255), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.drop_column("moving_for")
        batch.drop_column("moving")
