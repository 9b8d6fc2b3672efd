"""Floor 4 of the scheduler: the scheduler at work.

Owns one placement round with its I/O (``round_runner``: read catalog,
inventory and placements, plan, write), the timer loop that runs rounds as
leader only (``loop``), leader election (``leader``, ``lease_terms``), and taking nodes out of
service for the CLI and API (``node_service``).

May import every floor below (``scheduler.lifecycle``, ``scheduler.planner``,
``scheduler.persistence``), ``catalog`` and ``events``; never ``llmgw``, which
composes these into the command line and the API.
"""
