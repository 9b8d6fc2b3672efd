"""Rounds planned from what changed since the last one (issue 42): pure, above the planner.

Owns ``incremental`` (the previous round's inputs and plan, a round's changes, and the
plan they give: the previous plan when nothing the planner reads changed, else
``scheduler.planner.plan.plan`` on the inputs patched with the changes). May import
``catalog``, ``scheduler.lifecycle``, ``scheduler.planner`` and its ``fleet``; no I/O.
"""
