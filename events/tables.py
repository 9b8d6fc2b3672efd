"""The SQL tables of the event log. Alembic migrations create and change them; nothing else does."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    DateTime,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite has no 64-bit INTEGER PRIMARY KEY distinct from its rowid; the variant
# keeps positions plain integers there and BIGINT on PostgreSQL.
Position = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    SQLite stores no zone, so a naive value read back is UTC by construction;
    writing a naive value is refused because its zone would be a guess.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("refusing a naive datetime: the log records UTC only")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    pass


class EventRow(Base):
    """One entry of the append-only catalog log. Documented for auditors in the README."""

    __tablename__ = "events"
    __table_args__ = (UniqueConstraint("event_id", name="uq_events_event_id"),)

    # Gapless, starting at 1, in commit order: assigned under the append lock.
    position: Mapped[int] = mapped_column(Position, primary_key=True, autoincrement=False)
    # Unique; a retried command with the same idempotency key finds its first outcome here.
    event_id: Mapped[str] = mapped_column(String(200))
    # Events written by one command share it (a list add is several events).
    command_id: Mapped[str] = mapped_column(String(200), index=True)
    type: Mapped[str] = mapped_column(String(64))
    schema_version: Mapped[int] = mapped_column(Integer)
    # The model the event is about, for audits and `history --model`.
    model: Mapped[str | None] = mapped_column(String(255), index=True)
    # JSON text, kept exactly as written: a malformed row must be readable to be named.
    payload: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
