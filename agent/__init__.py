"""The node agent: ``llmgw agent`` on each machine.

It reports what the node has (the heartbeat), reads what the scheduler placed
on it, and makes the node match: starts each replica's engine as a child
process, stops the ones no longer placed, and reports whether each is
starting, ready or failed.

A package of its own beside ``catalog``, ``events`` and ``scheduler`` rather
than under ``llmgw``: it is a separate program on a separate machine that
talks to the control plane only over HTTP, so it imports nothing of the
server, the store or the CLI (``llmgw/cli/operate/agent.py`` only wires flags to
it). Its decisions (``reconcile``) are pure, like the planner's; processes,
files and HTTP sit at the edges (``processes``, ``state``, ``client``).
"""
