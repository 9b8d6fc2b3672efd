"""The event log's vocabulary: pure, importable without a database driver.

Owns what an event is (``types``), reading older payloads as the current version
(``upcast``), stored rows as events (``rows``), the tamper-evident hash ``chain``, and
the payload of a declared-file change (``declared_change``).

May import ``catalog`` only; never ``events.database`` or ``events.storage``
(tests/unit/events/test_pure_core.py imports it without SQLAlchemy or structlog).
"""
