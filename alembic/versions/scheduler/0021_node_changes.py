"""Nodes say when their content last changed; leases and changes are found by index.

Revision ID: 0021_node_changes
Revises: 0018_token_priority
Create Date: 2026-12-07

A round at 100,000 nodes must not read every node when few changed (issue 42). A full
report rewrites its node's row, and a heartbeat renews only ``reported_at``; neither says
whether what the planner reads (class, cards, memory, labels, fabric, reserved cards)
changed. ``changed_at`` does: a report sets it to its time only when that content differs
from the row's (None: not since this revision, so read with the whole inventory). The
round reads the nodes changed since the last it saw (``changed_at``) and those not fresh
(``reported_at`` older than the freshness boundary), each through its own index.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op
from events.database.tables import UTCDateTime

revision: str = "0021_node_changes"
down_revision: str | Sequence[str] | None = "0018_token_priority"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("changed_at", UTCDateTime(), nullable=True))
    op.create_index("ix_nodes_changed_at", "nodes", ["changed_at"])
    op.create_index("ix_nodes_reported_at", "nodes", ["reported_at"])


def downgrade() -> None:
    op.drop_index("ix_nodes_reported_at", table_name="nodes")
    op.drop_index("ix_nodes_changed_at", table_name="nodes")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("changed_at")
