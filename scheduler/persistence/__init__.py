"""Floor 3 of the scheduler: its storage on SQLite and PostgreSQL.

Owns the scheduler's tables (``tables``, created only by Alembic migrations),
what differs between the two back ends (``backend*``), the node inventory,
placements and fenced rounds (``inventory_store``, ``round_store``,
``placement_rows``), the lifecycle's rows (``lifecycle_store``), recorded rounds
and their versioned JSON (``recorded_rounds``, ``record_format``), the
placements' audit trail (``audit_trail``), reading rows so that a bad one is
skipped and named (``row_decoding``), and ``store.SchedulerStore``, the one
object the CLI, API and daemon use.

May import: ``catalog``, ``events``' database plumbing (``events.database.connection``,
``events.database.tables``), ``scheduler.lifecycle`` and ``scheduler.planner`` (for the
types it stores). Never ``scheduler.daemon`` or ``llmgw``.
"""
