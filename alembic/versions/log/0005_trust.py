"""Trust: adopted unhashed rows of the chain, and a keyed MAC on snapshots.

Revision ID: 0005_trust
Revises: 0004_scheduler
Create Date: 2026-12-03

- ``event_chain_adoptions``: a row after the chain's seal without a hash fails
  ``llmgw verify`` unless an operator adopted it (``llmgw verify
  --adopt-unhashed``); each adoption records who, why, when, and the chain's
  value over the row as it was adopted, so a later edit of it is still caught.
- ``catalog_snapshots.mac``: HMAC-SHA256 of the snapshot under a key held
  outside the database (LLMGW_SNAPSHOT_KEY); NULL when taken without a key.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from events.database.tables import UTCDateTime

revision: str = "0005_trust"
down_revision: str | None = "0004_scheduler"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Position = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "event_chain_adoptions",
        sa.Column("position", Position, primary_key=True, autoincrement=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("adopted_at", UTCDateTime(), nullable=False),
    )
    with op.batch_alter_table("catalog_snapshots") as batch:
        batch.add_column(sa.Column("mac", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("catalog_snapshots") as batch:
        batch.drop_column("mac")
    op.drop_table("event_chain_adoptions")
