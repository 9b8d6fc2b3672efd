"""A client token's limits, stored with the token.

Revision ID: 0016_token_limits
Revises: 0015_leadership_lease
Create Date: 2026-12-07

``tokens.limits`` holds a client token's limits (requests and tokens a minute, per model
too, requests in flight, a budget over a rolling period) as a JSON object
(catalog.forms.client_limits.ClientLimits.to_json); ``{}``: none. Set by `llmgw token
new --rpm/--tpm/--max-inflight/--budget`, changed by `llmgw token limits` (a
``token.limits_changed`` event each), read by the gateways through
``/v1/gateway/client-tokens`` and enforced there (gateway.stages.quota).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0016_token_limits"
down_revision: str | Sequence[str] | None = "0015_leadership_lease"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("limits", sa.Text(), nullable=False, server_default="{}"))


def downgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("limits")
