"""A floor beside the planner: the exact reference a round is measured against.

Owns ``program`` (a round as an integer program, solved by OR-Tools CP-SAT under a
deterministic work limit) and ``score`` (the planner's objective, counted the same
way for a heuristic plan and for the exact answer, so the two can be divided).

Pure in the planner's sense: no I/O, no clock, and the same inputs give the same
answer (one worker, a fixed ``max_deterministic_time``, a fixed seed). ``ortools``
is an optional extra (``pip install 'llmgw-control[exact]'``): nothing of the
control plane imports this floor; the benches and the tests do.

May import ``catalog`` and ``scheduler.planner`` (its types); never ``events``,
``scheduler.persistence``, ``scheduler.daemon`` or ``llmgw``.
"""
