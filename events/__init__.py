"""The catalog's event log: the pure core and its adapters.

Pure (importable without a database driver, SQLAlchemy or structlog): events.types,
events.upcast, events.replay, events.replay_reasons, events.apply,
events.idempotency, events.chain, events.rows and the ``Log`` protocol
(events.log), with its in-memory implementation (events.memory_log).

Adapters: the SQL logs (events.store, events.sqlite_log, events.postgres_log,
opened by events.backends.open_log), tables and migrations (events.tables,
events.migrate), snapshots, the chain's rows and history queries, the read
model (events.read_model) and the commands (events.commands), together in
events.catalog_service.

Nothing is imported here, so that importing one pure module never loads the
adapters.
"""
