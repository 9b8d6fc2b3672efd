"""The events' hash chain: prev_hash and hash columns, and the seal over older rows.

Stored rows are never rewritten: rows written before this migration keep no
hash. Instead the chain is computed over them here, in log order, and its
value at the last of them is recorded as the seal (table event_chain_seal);
the first event appended afterwards chains on from it. See events.core.chain.

Revision ID: 0002_event_hash_chain
Revises: 0001_events
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from events.core.chain import GENESIS, event_hash
from events.database.tables import UTCDateTime

revision: str = "0002_event_hash_chain"
down_revision: str | None = "0001_events"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Position = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
BATCH = 5_000

_events = sa.table(
    "events",
    sa.column("position", Position),
    sa.column("event_id", sa.String()),
    sa.column("command_id", sa.String()),
    sa.column("type", sa.String()),
    sa.column("schema_version", sa.Integer()),
    sa.column("model", sa.String()),
    sa.column("payload", sa.Text()),
    sa.column("actor", sa.String()),
    sa.column("reason", sa.Text()),
    sa.column("recorded_at", UTCDateTime()),
)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        # No append may land between computing the seal and committing it.
        op.execute("LOCK TABLE events IN EXCLUSIVE MODE")
    op.add_column("events", sa.Column("prev_hash", sa.String(64), nullable=True))
    op.add_column("events", sa.Column("hash", sa.String(64), nullable=True))
    seal = op.create_table(
        "event_chain_seal",
        sa.Column("position", Position, primary_key=True, autoincrement=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("sealed_at", UTCDateTime(), nullable=False),
    )
    position, value = 0, GENESIS
    while True:
        rows = bind.execute(
            sa.select(*_events.c)
            .where(_events.c.position > position)
            .order_by(_events.c.position)
            .limit(BATCH)
        ).all()
        for row in rows:
            value = event_hash(value, *row)
        if len(rows) < BATCH:
            break
        position = rows[-1][0]
    last = rows[-1][0] if rows else position
    op.bulk_insert(seal, [{"position": last, "hash": value, "sealed_at": datetime.now(UTC)}])


def downgrade() -> None:
    op.drop_table("event_chain_seal")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("hash")
        batch.drop_column("prev_hash")
