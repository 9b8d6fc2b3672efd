"""What every command of ``llmgw`` shares.

Owns the parser's common part (``parser``: global options, ``--version``, and commands
imported only when they run), the examples every ``--help`` ends with (``help_text``),
what every command needs (``context``: settings, the migrated store, the declared
catalog), ``--watch`` and ``--follow`` (``live``), times as operators type them
(``times``) and tables for people (``tables``).

May import ``catalog``, ``events`` and ``llmgw.settings``; never a command group or
``llmgw.api``. ``parser`` and ``help_text`` import nothing but argparse at load.
"""
