"""What one request may really use on each replica, as its engine says: two columns on placements.

Revision ID: 0011_llamacpp_context
Revises: 0010_docs_placement_outcome
Create Date: 2026-12-04

``effective_context_length`` is the context one request may use on the replica's
engine (llama.cpp's per-slot ``n_ctx`` from ``/props``, vLLM's ``max_model_len``),
read by the agent once the engine is ready; None until then, or when the engine
does not say. ``context_detail`` is how the engine came to it, in the operator's
words (``--ctx-size 8192 / --parallel 4 = 2048``), for the warning that names the
arithmetic when the catalog's ``context_length`` promises more.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0011_llamacpp_context"
down_revision: str | Sequence[str] | None = "0010_docs_placement_outcome"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.add_column(sa.Column("effective_context_length", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("context_detail", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("placements") as batch:
        batch.drop_column("context_detail")
        batch.drop_column("effective_context_length")
