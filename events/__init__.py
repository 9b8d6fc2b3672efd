"""The catalog's event log, in floors from the ground up; nothing is imported here.

- ``events.database``: the database itself: its tables (created only by Alembic
  migrations), connecting (``connection``), ``migrate``, and SQLite text that is not UTF-8.
- ``events.core``: the events' vocabulary, pure: ``types``, ``upcast``, ``rows``,
  the hash ``chain`` and the ``declared_change`` payload.
- ``events.storage``: the log: its ``Log`` protocol (``log``), in memory
  (``memory_log``) and in SQL (``sql_log``, ``sqlite_log``, ``postgres_log``, opened by
  ``backends.open_log``), with the SQL reads, the chain's rows and history queries.
- ``events.read``: replay (pure: ``replay``, ``replay_reasons``), snapshots, the
  read ``model`` and ``time_travel`` (the catalog at a past position).
- ``events.write``: the commands (``commands``), ``apply`` and ``idempotency``.
- ``events.audit``: ``llmgw verify`` and ``adopt``: the chain and the snapshots checked
  (``adoption``, ``snapshot_check``).

``events.catalog_service``, the one module here, is the front door: the read model and
the commands over one database. Pure (importable without a database driver, SQLAlchemy
or structlog): ``events.core``, ``events.read.replay``, ``events.read.replay_reasons``,
``events.write.apply``, ``events.write.idempotency``, ``events.storage.log`` and
``events.storage.memory_log`` (tests/unit/events/test_pure_core.py).

May import ``catalog``; never ``scheduler`` or ``llmgw``. Nothing is imported here, so
that importing one pure module never loads the adapters.
"""
