"""Benchmarks: ``python -m bench`` prints one table per area (see ``bench.__main__``).

A room per thing measured, each saying what it measures and which page of
docs/benchmarks holds its results: ``events`` (the event log), ``placement`` (the
planner), ``autoscale`` (the autoscaler), ``api`` (the API server and the command
line), ``gateway`` (the data plane); ``shared`` holds what they all use (timing, tables,
generated logs, the base-tree comparison).

Measures the whole, as the tests do: it may import any package of ours (including
``llmgw``); no package imports it (the tests do).
"""
