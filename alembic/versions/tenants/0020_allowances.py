"""Client tokens' shared allowances: the ``allowances`` table.

Revision ID: 0020_allowances
Revises: 0021_node_changes (numbered 0020 as reserved; chained after 0021,
which landed first)
Create Date: 2026-12-07

A limited client token's limits hold across gateways: each gateway draws the client's
allowance from the control plane in chunks and gives back what it did not use. The
accounts the chunks are granted from are a row per (client, limit), shared by every
control-plane replica (catalog.forms.allowance, events.write.allowances).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0020_allowances"
down_revision: str | Sequence[str] | None = "0021_node_changes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "allowances",
        sa.Column("client", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(160), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("level", sa.Double(), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("period_s", sa.Integer(), nullable=True),
        sa.Column("slots", sa.Text(), nullable=False, server_default="{}"),
    )


def downgrade() -> None:
    op.drop_table("allowances")
