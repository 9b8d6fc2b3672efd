"""The scheduler's commands: nodes, place, placements, daemon, explain, rollout.

Owns their arguments and help (``parser``), the scheduler commands (``commands``),
cordon, drain and rollout status (``lifecycle``) and ``llmgw explain`` (``explain``).

May import ``catalog``, ``events``, ``scheduler``, ``autoscale``, ``declared``,
llmgw's views, autoscaling and declared watch, ``llmgw.cli.shared`` and
``llmgw.cli.catalog``.
"""
