"""The autoscaler's benchmarks: what a decision round costs, how fast a load step is met.

``rounds`` (``python -m bench autoscale``: the pure round at 100 to 5,000 models, the
round as the daemon runs it on SQLite, and, without ``--quick``, ``step``: a load step
through a real server, agent and sim engines until the SLO is met again).

Results: docs/benchmarks/autoscaling.md.
"""
