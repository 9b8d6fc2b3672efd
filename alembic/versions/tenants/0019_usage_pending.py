"""Usage flushes pending their roll-up: rows of their own, not one event each.

Revision ID: 0019_usage_pending
Revises: 0020_allowances
Create Date: 2026-12-07

``POST /v1/usage`` stores a gateway flush's rows in ``usage_pending`` and its id in
``usage_flushes`` (primary key: a flush sent again stores nothing twice). The roll-up
(events.write.usage) appends one ``usage.recorded`` event per key and closed minute,
summed over all flushes, and deletes the rows it summed in the same transaction.

(0019 was the number reserved for it; it landed after 0021_node_changes and
0020_allowances, so it revises the head they left: one head.)
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from events.database.tables import UTCDateTime

revision: str = "0019_usage_pending"
down_revision: str | Sequence[str] | None = "0020_allowances"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "usage_pending",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("poster", sa.String(200), nullable=False),
        sa.Column("flush", sa.String(64), nullable=False),
        sa.Column("minute", UTCDateTime(), nullable=False),
        sa.Column("row", sa.Text(), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_usage_pending_minute", "usage_pending", ["minute"])
    op.create_table(
        "usage_flushes",
        sa.Column("poster", sa.String(200), primary_key=True),
        sa.Column("flush", sa.String(64), primary_key=True),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_usage_flushes_received_at", "usage_flushes", ["received_at"])


def downgrade() -> None:
    op.drop_table("usage_flushes")
    op.drop_table("usage_pending")
