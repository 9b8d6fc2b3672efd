"""Recorded rounds by reference: a round may be recorded as its changes from an earlier one.

Revision ID: 0024_rounds_by_reference
Revises: 0023_placement_changes
Create Date: 2026-12-07

A round at 100,000 nodes and 200,000 replicas recorded every node's report time, every
placement and every replica's state again, although a round that writes moved a few
replicas (issue 42: 10-15 s of writing for one node lost). ``placement_rounds.base_round``
names the round a row is recorded against (NULL: a full record, as every row before this
revision is), and ``placement_rounds.changes`` holds what changed since it (JSON; on a full
record written since, only the freshness boundary its chain's later rows refer to).
``scheduler.persistence.round_chain`` writes and rebuilds them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from events.database.tables import Position

revision: str = "0024_rounds_by_reference"
down_revision: str | Sequence[str] | None = "0023_placement_changes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("placement_rounds") as batch:
        batch.add_column(sa.Column("base_round", Position, nullable=True))
        batch.add_column(sa.Column("changes", sa.Text(), nullable=True))


def downgrade() -> None:
    # A row recorded by reference cannot be read without its chain: made a full record it
    # would need the chain rebuilt, which a migration does not do. Refuse rather than
    # leave rows that read as something they are not.
    bind = op.get_bind()
    by_reference = bind.execute(
        sa.text("SELECT count(*) FROM placement_rounds WHERE base_round IS NOT NULL")
    ).scalar_one()
    if by_reference:
        raise RuntimeError(
            f"{by_reference} recorded round(s) are recorded by reference to an earlier round "
            "(revision 0024); a release before it cannot read them. Delete them "
            "(DELETE FROM placement_rounds WHERE base_round IS NOT NULL) to downgrade."
        )
    with op.batch_alter_table("placement_rounds") as batch:
        batch.drop_column("changes")
        batch.drop_column("base_round")
