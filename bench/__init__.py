"""Benchmarks: ``python -m bench`` prints one table per area (see ``bench.__main__``).

Measures the whole, as the tests do: it may import any package of ours (including
``llmgw``); no package imports it (the tests do).
"""
