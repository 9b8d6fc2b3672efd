"""Floor 2 of the scheduler: the pure planner, its policies and its explanations.

Owns ``plan.plan`` ((demands, inventory, current placements, now) -> plan) and
everything it decides with: the nodes as reported (``inventory``), what is
asked and answered (``placements``, ``demands``), whether a node fits
(``fit``, ``capacity``), which placements survive (``survivors``), placing the
missing replicas (``order``, ``packing``, ``spread``), the spread repair
(``spread_repair`` and its ``repair_*`` helpers), ``preemption``, the fewest moves
that make room for an unplaced replica (``defrag``, not yet called by ``plan``), the
lifecycle inside a round (``rollout``), reusing the plan of an unchanged round
(``plan_cache``), and why things went where they did (``rejections``,
``resilience``, ``replica_stories``).

Pure: no I/O, no clock, no randomness. May import ``catalog`` and
``scheduler.lifecycle``; never ``events``, ``scheduler.persistence``,
``scheduler.daemon`` or ``llmgw``.
"""
