"""The read side: the catalog rebuilt from the log.

Owns ``replay`` (the declared models, then each stored event judged on its own) and
``replay_reasons`` (why each event was applied or skipped), both pure; ``snapshots`` of
replay state, so that start-up replays only the events after one; the read ``model``
at the log's head; and ``time_travel``, the catalog at a past position (``show --at``,
``diff``).

May import ``catalog``, ``events.core``, ``events.database`` and ``events.storage``;
never ``events.write`` (the read side changes nothing) or ``events.audit``.
"""
