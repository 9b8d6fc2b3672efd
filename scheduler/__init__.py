"""Placement: where each model's replicas run, and keeping that true over time.

Four floors, each a subpackage; a floor imports only the floors below it
(``tests/unit/test_architecture.py`` fails on an arrow back up):

- ``scheduler.lifecycle``: what agents say about replicas, how long a node may
  stay silent, and the lifecycle inputs a round records (cordons, failures).
- ``scheduler.planner``: the pure planner, ``plan(demands, nodes, current, now)``,
  and its policies (fit, packing, spread, repair, preemption, rollouts) and
  explanations (rejections, resilience, replica stories).
- ``scheduler.persistence``: the scheduler's tables on SQLite and PostgreSQL,
  the recorded rounds, the placements' audit trail, and reading rows so that a
  bad one is skipped and named.
- ``scheduler.daemon``: the scheduler at work: one round with its I/O, the
  timer loop, leader election, and the node service the CLI and API call.

Nothing is re-exported here: the command line imports
``scheduler.lifecycle.staleness`` for every command and must not pay for the
planner or pydantic's node reports. Import from the module that owns a name.
"""
