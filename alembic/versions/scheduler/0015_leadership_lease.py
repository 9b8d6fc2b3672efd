"""Leadership is a fenced lease: the ``leadership_lease`` table, and each round's epoch.

Revision ID: 0015_leadership_lease
Revises: 0014_serving_policies
Create Date: 2026-12-07

Leadership on PostgreSQL was a session advisory lock on an idle connection: a
frozen leader (SIGSTOP, a GC pause, a partition) kept it for as long as the
server kept the dead session (two hours by default), and nothing stopped it
writing when it woke. Now it is a row with a deadline, renewed every round, and
an epoch that grows at every change of holder; every round records the holder
and epoch it was written under, so an audit can check that no two leaders wrote
in one epoch (``scheduler.persistence.lease_store``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from events.database.tables import Position, UTCDateTime

revision: str = "0015_leadership_lease"
down_revision: str | Sequence[str] | None = "0014_serving_policies"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "leadership_lease",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("epoch", Position, nullable=False),
        sa.Column("acquired_at", UTCDateTime(), nullable=False),
        sa.Column("renewed_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
    )
    with op.batch_alter_table("placement_rounds") as batch:
        batch.add_column(sa.Column("leader", sa.String(255), nullable=True))
        batch.add_column(sa.Column("epoch", Position, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("placement_rounds") as batch:
        batch.drop_column("epoch")
        batch.drop_column("leader")
    op.drop_table("leadership_lease")
