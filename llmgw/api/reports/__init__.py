"""Agents' node reports recorded: many reports, one transaction.

Owns group commit (``group_commit``: concurrent writers, one transaction and one fsync
per batch) and recording node reports with it (``node_reports``). The report's lean
path before FastAPI's router is ``llmgw.api.routes.report_fast_path``.

May import ``catalog``, ``scheduler`` and ``llmgw.api``'s ``guards``, ``rendering`` and
``telemetry``.
"""
