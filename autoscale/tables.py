"""The autoscaler's SQL tables: gateways' signal windows, decision rounds, decisions.

Created and changed only by Alembic (``alembic/versions/scheduler/0008_autoscale.py``). They
share the catalog tables' metadata so that ``alembic check`` sees every table.

Windows are summaries (one row per gateway, model and window of ~5 s), never one row
per request; they and the rounds are deleted after ``[autoscale] retention``. The
events (decisions, notable holds, measured capacities) are the audit trail and stay.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Float, Integer, String, Table, Text
from sqlalchemy.orm import Mapped, mapped_column

from events.database.tables import Base, UTCDateTime


class ReportRow(Base):
    """One ``POST /v1/signals``: a gateway was heard, even with no traffic to report."""

    __tablename__ = "autoscale_reports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    gateway: Mapped[str] = mapped_column(String(255))
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    windows: Mapped[int] = mapped_column(Integer)


class WindowRow(Base):
    """One gateway's window of one model's traffic (``autoscale.windows.Window``)."""

    __tablename__ = "autoscale_windows"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    report_id: Mapped[int] = mapped_column(Integer)
    gateway: Mapped[str] = mapped_column(String(255))
    model: Mapped[str] = mapped_column(String(255))
    start: Mapped[datetime] = mapped_column(UTCDateTime())
    end: Mapped[datetime] = mapped_column(UTCDateTime())
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    requests: Mapped[int] = mapped_column(Integer)
    errors: Mapped[int] = mapped_column(Integer)
    waiting: Mapped[int] = mapped_column(Integer)
    inflight_mean: Mapped[float] = mapped_column(Float)
    inflight_max: Mapped[int] = mapped_column(Integer)
    queue_wait_p99_s: Mapped[float | None] = mapped_column(Float)
    ttft_p99_s: Mapped[float | None] = mapped_column(Float)
    tpot_p99_s: Mapped[float | None] = mapped_column(Float)
    replicas: Mapped[str] = mapped_column(Text)  # JSON {replica key: {requests, ...}}
    # len(replicas): what a decision reads, without decoding the JSON of every window.
    replica_count: Mapped[int] = mapped_column(Integer)


class RoundRow(Base):
    """A decision round the leader ran: when, and the policy and limits it used (by digest).

    Recorded whether or not it changed anything, so a backtest walks exactly the rounds
    that ran; the policy and limits are stored once per distinct content.
    """

    __tablename__ = "autoscale_rounds"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    policy_digest: Mapped[str] = mapped_column(String(64))
    limits_digest: Mapped[str] = mapped_column(String(64))
    changes: Mapped[int] = mapped_column(Integer)


class DocumentRow(Base):
    """A policy or a set of model limits, stored once by the digest of its JSON."""

    __tablename__ = "autoscale_documents"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    body: Mapped[str] = mapped_column(Text)


class EventRow(Base):
    """The autoscaler's trail: ``autoscale.decision``, ``autoscale.hold``, ``autoscale.capacity``.

    ``body`` is JSON: a decision's wanted count, its reason and its inputs (the window
    summary, the limits and the policy's parameters); a capacity's measured steps.
    """

    __tablename__ = "autoscale_events"

    position: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    type: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(255), index=True)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    actor: Mapped[str] = mapped_column(String(255))
    body: Mapped[str] = mapped_column(Text)


def table(row: type[Base]) -> Table:
    result = row.__table__
    assert isinstance(result, Table)
    return result
