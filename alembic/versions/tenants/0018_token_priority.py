"""A client token's place in a full model's queue: its priority class and its share.

Revision ID: 0018_token_priority
Revises: 0017_running_copies
Create Date: 2026-12-07

``llmgw token new NAME --role client --priority-class critical|standard|batch --share N``
stores both with the token (``tokens.priority_class``, ``tokens.share``); every gateway
reads them with the client tokens (``/v1/gateway/client-tokens``) and orders the waiters
of a model whose replicas are all full by them (gateway.stages.queue). Existing rows take
the defaults, ``standard`` and ``1``: what every token was before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0018_token_priority"
down_revision: str | Sequence[str] | None = "0017_running_copies"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A plain ADD COLUMN on both databases (SQLite needs no table copy for it).
    op.add_column(
        "tokens",
        sa.Column("priority_class", sa.String(16), nullable=False, server_default="standard"),
    )
    op.add_column("tokens", sa.Column("share", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("share")
        batch.drop_column("priority_class")
