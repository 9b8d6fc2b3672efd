"""The scheduler's SQL tables: the inventory, current placements, and their audit trail.

Created and changed only by Alembic migrations (alembic/versions), like the
catalog's log. They share the catalog tables' metadata so that `alembic check`
sees every table.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, Float, Integer, String, Table, Text, false
from sqlalchemy.orm import Mapped, mapped_column

from events.database.tables import Base, Position, UTCDateTime


class NodeRow(Base):
    """A node as its agent last reported it; ``reported_at`` is the control plane's clock."""

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    gpu_class: Mapped[str | None] = mapped_column(String(64))
    gpus: Mapped[int] = mapped_column(Integer)
    gpus_reserved: Mapped[int] = mapped_column(Integer)
    memory_gb: Mapped[float | None] = mapped_column(Float)
    labels: Mapped[str] = mapped_column(Text)  # JSON object
    fabric: Mapped[str | None] = mapped_column(String(255))
    # The lease: the last report or heartbeat. Indexed: a round reads the nodes not fresh.
    reported_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    # When the content above last changed (a report differing from the row); None: not
    # since revision 0021. A round reads the nodes changed since its last by this index.
    changed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), index=True)
    # Whether its agent has ever reported replica states. An older agent never
    # does, and its replicas must not time out for want of a report it cannot send.
    reports_replicas: Mapped[bool] = mapped_column(Boolean, server_default=false())
    # The address its agent advertised in the node's first report that had one: the
    # host its replicas' endpoints must name (scheduler.endpoints). Set once; cleared
    # with the node by `llmgw nodes forget`.
    address: Mapped[str | None] = mapped_column(String(253))


class PlacementRow(Base):
    """Where one replica of a model runs now."""

    __tablename__ = "placements"

    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    replica: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    profile: Mapped[str] = mapped_column(String(255))
    nodes: Mapped[str] = mapped_column(Text)  # JSON list of node names
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    gpu_class: Mapped[str | None] = mapped_column(String(64))
    memory_gb_per_node: Mapped[int] = mapped_column(Integer)
    round_id: Mapped[int] = mapped_column(Position)
    placed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # What its agent last said: placed (nothing yet), starting, ready, failed.
    state: Mapped[str] = mapped_column(String(16), server_default="placed")
    state_since: Mapped[datetime | None] = mapped_column(UTCDateTime())  # None: placed_at
    message: Mapped[str] = mapped_column(Text, server_default="")
    endpoint: Mapped[str | None] = mapped_column(String(2048))
    # What the replica runs (scheduler.planner.rollout.fingerprint); "" if placed before it existed.
    fingerprint: Mapped[str] = mapped_column(String(64), server_default="")
    # The model version it was placed with (catalog.changes.digest.model_version); "" before
    # versions. Its agent is sent that version's definition (ModelVersionRow).
    version: Mapped[str] = mapped_column(String(64), server_default="")
    # What one request may really use on its engine, as the agent read it once ready
    # (None: not yet, or the engine does not say), and how the engine came to it.
    effective_context_length: Mapped[int | None] = mapped_column(Integer)
    context_detail: Mapped[str] = mapped_column(Text, server_default="")
    # While the replica is being moved (scheduler.planner.defrag): why, and the model the
    # move makes room for ("" for a spread repair). "" when it is not moving.
    moving: Mapped[str] = mapped_column(Text, server_default="")
    moving_for: Mapped[str] = mapped_column(String(255), server_default="")
    # The change sequence of the last write to the row (``PlacementChangesRow.seq``): a
    # round reads the placements written since its last read by this index. 0: not since
    # revision 0023 (read with the whole placements).
    change_seq: Mapped[int] = mapped_column(Position, server_default="0", index=True)


class PlacementChangesRow(Base):
    """Where the placements' change sequence stands (one row; ``scheduler.persistence.
    placement_changes``).

    ``seq`` grows by one for each transaction that writes placements (a round's, a replica
    report's), taken under the numbering lock (``lock_trail``) and held to its commit, so
    every row stamped with a number at most the one a reader sees has committed.
    ``reporting`` grows whenever the set of nodes whose agents report replica states
    changes (a node's first replica report, a node forgotten): what a replica's state
    reads besides its own row.
    """

    __tablename__ = "placement_changes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(Position)
    reporting: Mapped[int] = mapped_column(Position)


class PlacementRoundRow(Base):
    """A round that changed placements, with what it was planned from.

    Enough to run the planner again on exactly the same inputs: the catalog
    position, the inventory (by digest, see ``InventoryRow``), when each node
    last reported, the time and the staleness policy. Rounds that change
    nothing are not recorded: there is nothing to explain. Since 0024 a row may
    hold only what changed since an earlier round (``base_round``, ``changes``).
    """

    __tablename__ = "placement_rounds"

    id: Mapped[int] = mapped_column(Position, primary_key=True, autoincrement=False)
    planned_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    catalog_position: Mapped[int] = mapped_column(Position)
    inventory_digest: Mapped[str] = mapped_column(String(64))
    reported_at: Mapped[str] = mapped_column(Text)  # JSON {node: ISO time}
    current: Mapped[str] = mapped_column(Text)  # JSON list: the placements before the round
    policy: Mapped[str] = mapped_column(Text)  # JSON staleness policy
    placed: Mapped[int] = mapped_column(Integer)
    removed: Mapped[int] = mapped_column(Integer)
    unplaced: Mapped[int] = mapped_column(Integer)
    # JSON: replica states, cordons, back-offs and their policy (None before 0005).
    lifecycle: Mapped[str | None] = mapped_column(Text)
    # The leadership lease the round was written under (``scheduler.persistence.lease_store``):
    # its holder and epoch. None before 0015, and on SQLite, where leadership is a flock.
    leader: Mapped[str | None] = mapped_column(String(255))
    epoch: Mapped[int | None] = mapped_column(Position)
    # Recorded by reference (``scheduler.persistence.round_chain``, revision 0024): the round
    # this row is recorded against, None for a full record (every row before 0024); and
    # JSON of what changed since it (on a full record since 0024: only its freshness
    # boundary). A row with a base keeps its JSON columns above empty and the inventory
    # digest of its chain's full record.
    base_round: Mapped[int | None] = mapped_column(Position)
    changes: Mapped[str | None] = mapped_column(Text)


class PlacementOutcomeRow(Base):
    """What the scheduler's last round left unplaced, and why: one row, replaced whole.

    Recorded rounds hold a round's inputs, and only rounds that change placements are
    recorded; a round that leaves a new model unplaced changes nothing and is not. So
    the daemon writes the unplaced replicas with their reasons here whenever they
    differ from the last it wrote (``scheduler.outcome_store``): ``GET /v1/fleet``
    reads them rather than planning a round per request.
    """

    __tablename__ = "placement_outcome"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    # The round that gave these reasons (they held, unchanged, in every round since).
    planned_at: Mapped[datetime] = mapped_column(UTCDateTime())
    catalog_position: Mapped[int] = mapped_column(Position)
    # The last recorded round (placement_rounds.id) when it was written; 0 if none.
    round_id: Mapped[int] = mapped_column(Position)
    unplaced: Mapped[str] = mapped_column(Text)  # JSON [{model, replica, reason}]


class LeadershipLeaseRow(Base):
    """Who leads the scheduler, under which epoch, and until when (one row per role).

    ``expires_at`` is the database's clock, so replicas whose clocks disagree still
    agree on when the lease lapsed. ``epoch`` grows by one at every change of
    holder: every write a leader makes checks, in its own transaction, that its
    epoch is still the current one (``scheduler.persistence.lease_store``).
    """

    __tablename__ = "leadership_lease"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))
    epoch: Mapped[int] = mapped_column(Position)
    acquired_at: Mapped[datetime] = mapped_column(UTCDateTime())
    renewed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ServingPolicyRow(Base):
    """The policy a serving process runs with: written when ``llmgw serve`` or ``llmgw
    daemon`` starts, and when a placer places while the policy in force differs from its
    own (``scheduler.persistence.serving_policy``). What the CLI's views judge by, beside
    the policy each recorded round keeps; only the newest ``KEPT_POLICIES`` rows are kept.
    """

    __tablename__ = "serving_policies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # One per process (a random id), so its own records can be told from another's.
    instance: Mapped[str] = mapped_column(String(64))
    process: Mapped[str] = mapped_column(String(32))  # serve or daemon
    # Whether the process runs placement rounds (serve --with-scheduler, daemon).
    places: Mapped[bool] = mapped_column(Boolean)
    why: Mapped[str] = mapped_column(String(32))  # started or placing
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    interval_s: Mapped[float | None] = mapped_column(Float)  # between rounds; None: none
    policy: Mapped[str] = mapped_column(Text)  # JSON, as placement_rounds.policy


class InventoryRow(Base):
    """An inventory's content (everything but report times), stored once per distinct digest."""

    __tablename__ = "inventories"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    nodes: Mapped[str] = mapped_column(Text)  # JSON list of node reports


class PlacementEventRow(Base):
    """The audit trail of placements: every replica placed, removed or updated, and why."""

    __tablename__ = "placement_events"

    position: Mapped[int] = mapped_column(Position, primary_key=True, autoincrement=False)
    round_id: Mapped[int] = mapped_column(Position, index=True)
    type: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(255), index=True)
    replica: Mapped[int] = mapped_column(Integer)
    profile: Mapped[str] = mapped_column(String(255))
    nodes: Mapped[str] = mapped_column(Text)  # JSON list of node names
    reason: Mapped[str] = mapped_column(Text)
    catalog_position: Mapped[int] = mapped_column(Position)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    # Who caused it: "" for the scheduler's own decisions, else an operator or agent.
    actor: Mapped[str] = mapped_column(String(255), server_default="")


class CordonRow(Base):
    """A node an operator took out of service: ``mode`` is cordoned or draining."""

    __tablename__ = "node_cordons"

    node: Mapped[str] = mapped_column(String(255), primary_key=True)
    mode: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text)
    since: Mapped[datetime] = mapped_column(UTCDateTime())


class ModelVersionRow(Base):
    """A model's definition as of one version (catalog.changes.digest.model_version).

    Written when a replica is first placed with that version, kept while any
    may still run it: a replica's agent is sent its version's definition, not
    the current one, so a catalog change never restarts an engine in place.
    """

    __tablename__ = "model_versions"

    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    definition: Mapped[str] = mapped_column(Text)  # JSON: Model.to_definition()
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime())


class RunningCopyRow(Base):
    """An engine a node's agent reported running for a replica not placed on that node.

    Replaced by each report of the node's replicas; read by a round, which may place the
    replica again where it runs (``scheduler.planner.readoption``).
    """

    __tablename__ = "running_copies"

    node: Mapped[str] = mapped_column(String(255), primary_key=True)
    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    replica: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    profile: Mapped[str] = mapped_column(String(255))
    version: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))  # starting or ready
    endpoint: Mapped[str | None] = mapped_column(String(2048))
    reported_at: Mapped[datetime] = mapped_column(UTCDateTime())


class FailureRow(Base):
    """How often a model's replicas failed on a node, for the back-off that avoids it."""

    __tablename__ = "replica_failures"

    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    node: Mapped[str] = mapped_column(String(255), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer)
    last_failed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_reason: Mapped[str] = mapped_column(Text)


def table(row: type[Base]) -> Table:
    """The Core table of a mapped class (typed: declarative tables are Tables)."""
    result = row.__table__
    assert isinstance(result, Table)
    return result
