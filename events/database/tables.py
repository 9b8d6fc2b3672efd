"""The SQL tables of the event log. Alembic migrations create and change them; nothing else does."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    DateTime,
    Double,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
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
    # Unique. A keyed command's first event carries the key as its id, so a retried
    # command with the same idempotency key finds its first outcome through this index.
    event_id: Mapped[str] = mapped_column(String(200))
    # Events written by one command share it (a list add is several events). Not
    # indexed since 0006: keys are found by event_id (events.storage.sql_log._by_command).
    command_id: Mapped[str] = mapped_column(String(200))
    type: Mapped[str] = mapped_column(String(64))
    schema_version: Mapped[int] = mapped_column(Integer)
    # The model the event is about, for audits and `history --model`.
    model: Mapped[str | None] = mapped_column(String(255), index=True)
    # JSON text, kept exactly as written: a malformed row must be readable to be named.
    payload: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    # The hash chain (events.core.chain): sha256 hex of the previous event's hash and
    # this row's content, and the previous event's hash. NULL on rows written
    # before migration 0002 (they are covered by the chain's seal instead).
    prev_hash: Mapped[str | None] = mapped_column(String(64))
    hash: Mapped[str | None] = mapped_column(String(64))


class ChainSealRow(Base):
    """Where the hash chain starts: one row, written by migration 0002.

    ``position`` is the last event written before the chain existed (0 for a
    log created with it) and ``hash`` the chain's value there, computed over
    those rows when the migration ran. Rows are never rewritten to add hashes.
    """

    __tablename__ = "event_chain_seal"

    position: Mapped[int] = mapped_column(Position, primary_key=True, autoincrement=False)
    hash: Mapped[str] = mapped_column(String(64))
    sealed_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ChainAdoptionRow(Base):
    """An unhashed row after the seal that an operator vouched for (``verify --adopt-unhashed``).

    ``hash`` is the chain's value at ``position`` computed over the row as it
    was when adopted: the row is covered from then on, and an edit of it since
    is caught like any other.
    """

    __tablename__ = "event_chain_adoptions"

    position: Mapped[int] = mapped_column(Position, primary_key=True, autoincrement=False)
    hash: Mapped[str] = mapped_column(String(64))
    actor: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text)
    adopted_at: Mapped[datetime] = mapped_column(UTCDateTime())


class SnapshotRow(Base):
    """The replay state at a log position, so that start-up replays only what follows it.

    Bound to the declared configuration it was built with and to the code that
    built it (events.read.snapshots); ``checksum`` covers every other column, so a
    damaged or hand-edited snapshot is ignored rather than trusted.
    """

    __tablename__ = "catalog_snapshots"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    position: Mapped[int] = mapped_column(Position)
    # The chain hash of the event at ``position``: a log rewritten under the
    # snapshot no longer matches it.
    event_hash: Mapped[str | None] = mapped_column(String(64))
    declared_digest: Mapped[str] = mapped_column(String(64), index=True)
    code_version: Mapped[str] = mapped_column(String(255))
    applied_count: Mapped[int] = mapped_column(Integer)
    skipped_count: Mapped[int] = mapped_column(Integer)
    model_count: Mapped[int] = mapped_column(Integer)
    # JSON array of the runtime models' definitions, in the order they were accepted.
    models: Mapped[str] = mapped_column(Text)
    checksum: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # HMAC-SHA256 under the snapshot key (LLMGW_SNAPSHOT_KEY), held outside the
    # database: the checksum only catches accidents, anyone who can write the
    # table can recompute it. NULL when taken without a key.
    mac: Mapped[str | None] = mapped_column(String(64))


class DeclaredCatalogRow(Base):
    """What the processes watching a declared catalog file last made of it.

    One row per file: the digest in force (catalog.changes.digest) and its definitions,
    and, when the file as it is now was refused, why. ``llmgw status`` and
    ``llmgw rollout status`` read it, so an operator sees from any terminal which
    catalog the control plane runs, and a refused edit, not only in a server's log.
    """

    __tablename__ = "declared_catalogs"

    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))
    models: Mapped[int] = mapped_column(Integer)
    # JSON list of the declared definitions in force (Model.to_definition()).
    definitions: Mapped[str] = mapped_column(Text)
    loaded_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # "" when the file as it is now is the one in force; else the refusal (JSON).
    refusal: Mapped[str] = mapped_column(Text, server_default="")
    refused_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The process that wrote this row last (its role, host and pid).
    by: Mapped[str] = mapped_column(String(255), server_default="")


class TokenRow(Base):
    """A bearer token issued into the database (``llmgw token new|revoke|import``).

    Only its SHA-256 is kept, never the token. Every replica checks bearer tokens
    against the rows not revoked (llmgw.api.runtime.live_tokens), and gateways read the
    client tokens' rows through ``/v1/gateway/client-tokens``. A revoked row stays, with
    who revoked it and when, so its hash can never be issued or imported again and an
    auth file still listing it is overruled. Each issue and revocation is also an event
    of the catalog's log (``token.issued``, ``token.revoked``: events.core.token_change),
    appended in the same transaction; ``revision`` is that event's position, so a
    server sees that the table changed from ``max(revision)`` alone.

    What a token may do beyond its role is a column each: ``nodes`` (an agent's),
    ``models`` (a client's) and ``limits`` (a client's: requests and tokens a minute,
    requests in flight, a budget; ``llmgw token limits`` changes them, with a
    ``token.limits_changed`` event).
    """

    __tablename__ = "tokens"
    __table_args__ = (
        UniqueConstraint("sha256", name="uq_tokens_sha256"),
        # One token in force per name (the actor of its events); a revoked name may
        # be issued again.
        Index(
            "uq_tokens_active_name",
            "name",
            unique=True,
            sqlite_where=text("revoked_at IS NULL"),
            postgresql_where=text("revoked_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(32))
    # Lowercase hex of the token's SHA-256 (llmgw.api.guards.tokens.digest).
    sha256: Mapped[str] = mapped_column(String(64))
    # JSON lists of names: the nodes an agent token reports, the models a client token uses.
    nodes: Mapped[str] = mapped_column(Text, server_default="[]")
    models: Mapped[str] = mapped_column(Text, server_default="[]")
    # A JSON object: a client token's limits (catalog.forms.client_limits); {}: none.
    limits: Mapped[str] = mapped_column(Text, server_default="{}")
    # A client token's place in a full model's queue at the gateway (gateway.stages.queue).
    priority_class: Mapped[str] = mapped_column(String(16), server_default="standard")
    share: Mapped[int] = mapped_column(Integer, server_default="1")
    issued_at: Mapped[datetime] = mapped_column(UTCDateTime())
    issued_by: Mapped[str] = mapped_column(String(255))
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_by: Mapped[str | None] = mapped_column(String(255))
    # The log position of the event of this row's last change (issue or revocation).
    revision: Mapped[int] = mapped_column(Position, index=True)


class UsagePendingRow(Base):
    """One row of a gateway's usage flush (``POST /v1/usage``) not yet rolled up.

    The roll-up (events.write.usage.roll_up) sums the rows of every closed minute into
    ``usage.recorded`` events and deletes them in the same transaction; until then the
    ledger's reads add them to the events. ``row`` is the row's JSON as posted (checked),
    without who posted it (``poster``) or the flush (``flush``).
    """

    __tablename__ = "usage_pending"

    id: Mapped[int] = mapped_column(Position, primary_key=True, autoincrement=True)
    poster: Mapped[str] = mapped_column(String(200))
    flush: Mapped[str] = mapped_column(String(64))
    minute: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    row: Mapped[str] = mapped_column(Text)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime())


class UsageFlushRow(Base):
    """A flush received (who posted it and its id): the same flush sent again stores
    nothing. Kept ``FLUSH_MEMORY`` after its rows (events.write.usage), long past any
    gateway's retry."""

    __tablename__ = "usage_flushes"

    poster: Mapped[str] = mapped_column(String(200), primary_key=True)
    flush: Mapped[str] = mapped_column(String(64), primary_key=True)
    rows: Mapped[int] = mapped_column(Integer)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)


class AllowanceRow(Base):
    """A limited client token's shared account of one limit (catalog.forms.allowance).

    Gateways draw a client's allowance from it in chunks and give back what they did not
    use (``POST /v1/gateway/allowances``), so a limit holds across gateways and across
    the control plane's replicas: each draw reads and writes its rows in one
    transaction, the rows locked (``FOR UPDATE`` on PostgreSQL; SQLite has one writer).
    ``kind``: ``requests``, ``tokens``, ``tokens:MODEL`` or ``budget``. A bucket's
    ``level`` is what is left to grant at ``at`` (seconds since the epoch, the
    database's clock on PostgreSQL); a budget's ``slots`` (JSON, slot -> tokens) what
    was granted in each slot of its ``period_s``.
    """

    __tablename__ = "allowances"

    client: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(160), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    level: Mapped[float] = mapped_column(Double)
    at: Mapped[float] = mapped_column(Double)
    period_s: Mapped[int | None] = mapped_column(Integer)
    slots: Mapped[str] = mapped_column(Text, server_default="{}")
