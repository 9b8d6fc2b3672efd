"""Keyed commands are found through the event id's unique index: drop ``ix_events_command_id``.

Revision ID: 0006_keys_by_event_id
Revises: 0005_lifecycle, 0005_trust
Create Date: 2026-12-03

The first event of a keyed command carries the key as its ``event_id`` (unique
since 0001), and a command's events are consecutive, so the idempotency lookup
(events.storage.sql_log ``_by_command``) finds them through that index. The index on
``command_id`` said nothing more, and every append paid for it: one more b-tree
page in each commit's WAL frames (BENCHMARKS.md, "Validated adds"). Nothing
else reads by ``command_id``.

Also the merge of the two 0005 heads, so that the history has one head again.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0006_keys_by_event_id"
down_revision: str | Sequence[str] | None = ("0005_lifecycle", "0005_trust")
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_events_command_id", table_name="events")


def downgrade() -> None:
    op.create_index("ix_events_command_id", "events", ["command_id"])
