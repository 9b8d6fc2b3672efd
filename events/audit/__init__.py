"""Audits of the log, the operator's explicit acts: ``llmgw verify`` and ``adopt``.

Owns verifying the hash chain and adopting unhashed rows (``adoption``), and checking
each snapshot against a replay up to its position (``snapshot_check``).

May import ``catalog``, ``events.core``, ``events.database``, ``events.storage`` and
``events.read``; nothing of ``events`` imports it.
"""
