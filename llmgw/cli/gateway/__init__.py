"""``llmgw gateway``: the data plane's command.

Owns its arguments and help (``parser``) and wiring the settings to ``gateway``
(``command``).

May import ``gateway``, llmgw's settings and logs, and ``llmgw.cli.shared``.
"""
