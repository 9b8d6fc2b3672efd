"""The event log's benchmarks: replaying it, appending to it, beside the eventsourcing peer.

``replay`` (the catalog rebuilt from 10k to 1M stored events, SQLite and PostgreSQL),
``decode`` (one stored add decoded, pydantic against msgspec), ``append`` (validated
adds per second), ``append_floor`` and ``append_phases`` (where an add stands against the
store's own floor, and where its CPU goes), ``writers`` (concurrent ``llmgw add``
commands on a brand-new database), ``peer`` and ``peer_app`` (the ``eventsourcing``
library doing the same jobs: ``python -m bench peer``, with ``make bench``'s extras).

Results: docs/benchmarks/replay.md, docs/benchmarks/validated-adds.md,
docs/benchmarks/writers.md and docs/benchmarks/first-report.md.
"""
