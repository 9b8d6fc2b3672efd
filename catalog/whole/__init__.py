"""The catalog as a whole: the set of models and the rules between them.

``rules`` (names and aliases unique, fallbacks resolve), ``catalog`` (the immutable
catalog, built and checked at once), ``state`` (declared models plus runtime additions,
checked incrementally).

May import ``catalog.errors``, ``catalog.forms`` and ``catalog.definition``.
"""
