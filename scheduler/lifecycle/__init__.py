"""Floor 1 of the scheduler: the replica lifecycle's vocabulary, pure and small.

Owns what an agent says about the replicas on its node (``replica_reports``),
how long a node may stay silent before it is stale or lost (``staleness``), and
the lifecycle inputs a round records beside catalog and inventory: cordons,
drains, failures and back-off, startup timeouts (``inputs``). The rules that
act on them inside a round are the planner's (``scheduler.planner.rollout``).

May import: ``catalog`` and the standard library (pydantic for the report
boundary). Never the other scheduler floors, ``events`` or ``llmgw``: the
command line's settings import ``staleness`` for every command.
"""
