"""Pinned model versions and the declared catalog's reload status.

Revision ID: 0009_rollout_versions
Revises: 0008_autoscale
Create Date: 2026-12-04

- ``placements.version``: the model version (definition digest) a replica was
  placed with. Its agent is sent that version's definition until a rollout
  replaces the replica, so a catalog change never restarts an engine in place.
  Rows written before read as "" (nothing pinned: the current definition is
  sent, as before, and the next round pins them).
- ``model_versions``: each version's definition, written when a replica is
  first placed with it.
- ``declared_catalogs``: what the processes watching a declared catalog file
  last made of it (the digest in force, or the refusal of an edit).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from events.database.tables import UTCDateTime

revision: str = "0009_rollout_versions"
down_revision: str | Sequence[str] | None = "0008_autoscale"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.add_column(sa.Column("version", sa.String(64), nullable=False, server_default=""))
    op.create_table(
        "model_versions",
        sa.Column("model", sa.String(255), primary_key=True),
        sa.Column("version", sa.String(64), primary_key=True),
        sa.Column("definition", sa.Text(), nullable=False),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "declared_catalogs",
        sa.Column("path", sa.String(1024), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("models", sa.Integer(), nullable=False),
        sa.Column("definitions", sa.Text(), nullable=False),
        sa.Column("loaded_at", UTCDateTime(), nullable=False),
        sa.Column("refusal", sa.Text(), nullable=False, server_default=""),
        sa.Column("refused_at", UTCDateTime(), nullable=True),
        sa.Column("by", sa.String(255), nullable=False, server_default=""),
    )


def downgrade() -> None:
    op.drop_table("declared_catalogs")
    op.drop_table("model_versions")
    with op.batch_alter_table("placements") as batch:
        batch.drop_column("version")
