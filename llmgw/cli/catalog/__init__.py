"""The catalog's commands: models, add, apply, remove, resolve, show, db, and the audit.

Owns their arguments and help (``parser``), the catalog commands (``commands``), the
dry run of add and apply (``dry_run``), ``llmgw history`` (``history``) and replay,
diff, verify and snapshot (``audit``).

May import ``catalog``, ``events``, ``scheduler``, ``llmgw.views`` and
``llmgw.cli.shared``. ``parser`` imports nothing but argparse and ``llmgw.cli.shared``.
"""
