"""The write side: the commands that append to the log.

Owns the handlers of add, remove and apply (``commands``), making a model's definition
exactly the one given (``apply``, pure) and judging a repeated idempotency key
(``idempotency``, pure).

May import ``catalog``, ``events.core``, ``events.database``, ``events.storage`` and
``events.read`` (a command is judged against the read model); never ``events.audit``.
``events.catalog_service`` pairs these commands with the read model.
"""
