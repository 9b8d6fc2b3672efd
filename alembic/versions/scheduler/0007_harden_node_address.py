"""Nodes register the address their agent advertises; endpoints stored before are cleared.

Revision ID: 0007_harden_node_address
Revises: 0006_keys_by_event_id
Create Date: 2027-01-10

An agent may report only endpoints on its node's own address or in a network
the operator allows (scheduler.lifecycle.endpoints). ``nodes.address`` holds the address
registered with the node's first report that carries one. Endpoints stored
before this check was made were never held to it: they are cleared, and each
agent reports its replicas' endpoints again within one interval, checked.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_harden_node_address"
down_revision: str | Sequence[str] | None = "0006_keys_by_event_id"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("address", sa.String(253), nullable=True))
    op.execute("UPDATE placements SET endpoint = NULL")


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("address")
