"""Engines agents run that are not placed on their node: the ``running_copies`` table.

Revision ID: 0017_running_copies
Revises: 0016_token_limits
Create Date: 2026-12-07

A node silent for ``stale_after`` plus ``grace`` is given up and its replicas unplaced,
though its engines may still run. When its agent comes back it reports them; these
reports were dropped (no such replica is placed on the node). They are now kept, a row
per engine, replaced by each report of the node's replicas, so that the next round can
place such a replica again where it runs (``scheduler.planner.readoption``) rather than
have its engine stopped and another started.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from events.database.tables import UTCDateTime

revision: str = "0017_running_copies"
down_revision: str | Sequence[str] | None = "0016_token_limits"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "running_copies",
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("model", sa.String(255), primary_key=True),
        sa.Column("replica", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("profile", sa.String(255), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("endpoint", sa.String(2048), nullable=True),
        sa.Column("reported_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("running_copies")
