"""Autoscaling's commands: autoscale history, explain and backtest, and bench.

Owns their arguments and help (``parser``), ``llmgw autoscale ...`` (``commands``) and
one replica's capacity against the SLO (``bench``).

May import ``autoscale``, ``catalog``, ``scheduler``, ``llmgw.autoscale_view`` and
``llmgw.cli.shared``.
"""
