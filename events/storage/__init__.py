"""The event log stored: its protocol and its back ends.

Owns the ``Log`` protocol and what every back end shares (``log``, pure), the log in
memory (``memory_log``, pure), and in SQL: what SQLite and PostgreSQL share
(``sql_log``), each one's own (``sqlite_log``, ``postgres_log``), opening the right one
(``backends.open_log``), reading rows on the driver's cursor (``sql_reads``), the hash
chain's columns (``chain_rows``) and the history queries of ``llmgw history``
(``history``).

May import ``catalog``, ``events.core`` and ``events.database``; never the floors that
build on the log (``events.read``, ``events.write``, ``events.audit``).
"""
