"""Placements say when they last changed, by a sequence; a round reads only those.

Revision ID: 0023_placement_changes
Revises: 0019_usage_pending
Create Date: 2026-12-07

A round at 200,000 placements must not read (and decode) every placement when few
changed (issue 42). Every transaction that writes placements (a round, a replica report)
takes the next number of ``placement_changes.seq`` under the numbering lock and stamps
the rows it writes with it (``placements.change_seq``); a round reads the rows stamped
after the number it last saw, by index. A sequence, not a time: no clock is trusted, and
the lock orders the numbers as the commits. ``placement_changes.reporting`` counts the
changes of the set of nodes whose agents report replica states (a replica's state reads
it). Existing rows take 0: read with the whole placements, as a placer's first read is.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from events.database.tables import Position

revision: str = "0023_placement_changes"
down_revision: str | Sequence[str] | None = "0019_usage_pending"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.add_column(sa.Column("change_seq", Position, nullable=False, server_default="0"))
    op.create_index("ix_placements_change_seq", "placements", ["change_seq"])
    changes = op.create_table(
        "placement_changes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("seq", Position, nullable=False),
        sa.Column("reporting", Position, nullable=False),
    )
    op.bulk_insert(changes, [{"id": 1, "seq": 0, "reporting": 0}])


def downgrade() -> None:
    op.drop_table("placement_changes")
    op.drop_index("ix_placements_change_seq", table_name="placements")
    with op.batch_alter_table("placements") as batch:
        batch.drop_column("change_seq")
