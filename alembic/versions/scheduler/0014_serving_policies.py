"""The policy each serving process runs with, so that the CLI judges as the server does.

Revision ID: 0014_serving_policies
Revises: 0013_tokens
Create Date: 2026-12-07

``llmgw status``, ``nodes list``, ``place --dry-run`` and ``explain`` read the database
from processes of their own, and judged a node's silence by their own settings (by
default 90 s / 5 min) while the server ran with others (``--stale-after 3 --grace 3``):
a node the server had given up was shown fresh. Rounds already record the policy they
ran with, but a round that changes nothing is not recorded, so a server that restarted
with another policy left no trace of it. ``serving_policies`` holds a row per start of
``llmgw serve`` and ``llmgw daemon``, and one when a placer places while the policy in
force is not its own (``scheduler.persistence.serving_policy``). Nothing is backfilled:
before a server writes its first row, the views judge by the last round's policy.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from events.database.tables import UTCDateTime

revision: str = "0014_serving_policies"
down_revision: str | Sequence[str] | None = "0013_tokens"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "serving_policies",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.Column("instance", sa.String(64), nullable=False),
        sa.Column("process", sa.String(32), nullable=False),
        sa.Column("places", sa.Boolean(), nullable=False),
        sa.Column("why", sa.String(32), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("interval_s", sa.Float(), nullable=True),
        sa.Column("policy", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("serving_policies")
