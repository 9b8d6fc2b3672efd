"""The planner's ground floor: the cluster as a round sees it.

Owns the nodes as reported (``inventory``), the replicas and their placements, asked
and answered (``placements``), whether a profile fits a node and why not (``fit``,
``rejections``), and the free room a round consumes as it places (``capacity``).
Everything else in ``scheduler.planner`` builds on these; they import nothing of the
planner above them (``tests/unit/test_architecture.py`` holds that).

Pure: no I/O. May import ``catalog`` and ``scheduler.lifecycle``.
"""
