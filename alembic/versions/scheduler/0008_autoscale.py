"""Autoscaling: gateways' signal windows, decision rounds, the autoscaler's events.

Revision ID: 0008_autoscale
Revises: 0007_harden_node_address
Create Date: 2026-12-04

New tables only: nothing written before needs a default. Windows and rounds are
pruned after ``[autoscale] retention``; their indexes on time make that a range
delete. Events are kept: they are the audit trail of every decision.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from events.database.tables import UTCDateTime

revision: str = "0008_autoscale"
down_revision: str | Sequence[str] | None = "0007_harden_node_address"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "autoscale_reports",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("gateway", sa.String(255), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("windows", sa.Integer(), nullable=False),
    )
    op.create_index("ix_autoscale_reports_received_at", "autoscale_reports", ["received_at"])
    op.create_table(
        "autoscale_windows",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("report_id", sa.Integer(), nullable=False),
        sa.Column("gateway", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("start", UTCDateTime(), nullable=False),
        sa.Column("end", UTCDateTime(), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("waiting", sa.Integer(), nullable=False),
        sa.Column("inflight_mean", sa.Float(), nullable=False),
        sa.Column("inflight_max", sa.Integer(), nullable=False),
        sa.Column("queue_wait_p99_s", sa.Float(), nullable=True),
        sa.Column("ttft_p99_s", sa.Float(), nullable=True),
        sa.Column("tpot_p99_s", sa.Float(), nullable=True),
        sa.Column("replicas", sa.Text(), nullable=False),
        sa.Column("replica_count", sa.Integer(), nullable=False),
    )
    op.create_index("ix_autoscale_windows_received_at", "autoscale_windows", ["received_at"])
    op.create_table(
        "autoscale_rounds",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("policy_digest", sa.String(64), nullable=False),
        sa.Column("limits_digest", sa.String(64), nullable=False),
        sa.Column("changes", sa.Integer(), nullable=False),
    )
    op.create_index("ix_autoscale_rounds_at", "autoscale_rounds", ["at"])
    op.create_table(
        "autoscale_documents",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
    )
    op.create_table(
        "autoscale_events",
        sa.Column("position", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("recorded_at", UTCDateTime(), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
    )
    op.create_index("ix_autoscale_events_model", "autoscale_events", ["model"])
    op.create_index("ix_autoscale_events_recorded_at", "autoscale_events", ["recorded_at"])


def downgrade() -> None:
    for name in (
        "autoscale_events",
        "autoscale_documents",
        "autoscale_rounds",
        "autoscale_windows",
        "autoscale_reports",
    ):
        op.drop_table(name)
