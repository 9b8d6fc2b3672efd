"""Floor 2 of the scheduler: the pure planner, its policies and its explanations.

Owns ``plan.plan`` ((demands, inventory, current placements, now) -> plan) and
everything it decides with. Its ground floor is ``fleet`` (the nodes as reported, the
placements, whether a node fits and why not, free capacity); above it, what is asked
(``demands``), which placements survive (``survivors``), placing the missing replicas
(``order``, ``packing``, ``spread``, and ``ejection``, which re-places this round's new
replicas to use what packing left), the spread repair (``spread_repair`` and its
``repair_*`` helpers), ``preemption``, the fewest moves that make room for an unplaced
replica or repair a spread (``defrag``), the lifecycle inside a round (``rollout``),
reusing what an unchanged round can keep (``rounds``, above: a round planned from what
changed), and why things went where they did (``resilience``, ``replica_stories``).

Pure: no I/O, no clock, no randomness. May import ``catalog`` and
``scheduler.lifecycle``; never ``events``, ``scheduler.persistence``,
``scheduler.daemon`` or ``llmgw``.
"""
