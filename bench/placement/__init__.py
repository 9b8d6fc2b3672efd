"""The placement benchmarks: the planner's speed and the quality of what it places.

``rounds`` (``python -m bench placement``: one round of the planner on real and synthetic
fleets, against ``firstfit``, the baseline), ``spreadcheck`` (a plan's spread checked by
brute force), ``spread_repair`` (the repair's partner index against the scan it
replaced), ``defrag`` (a round with defragmentation on and off), ``exact`` and
``idle_cards`` (the planner against CP-SAT's optimum); the fleets they share:
``fleets`` (real and synthetic), read from ``openb`` and ``spot`` (the Alibaba traces in
tests/data).

Results: docs/benchmarks/placement.md, docs/benchmarks/exact-placement.md and
docs/benchmarks/defragmentation.md.
"""
