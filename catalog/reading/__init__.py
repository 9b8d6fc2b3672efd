"""Reading definitions from people and programs, within bounds.

``documents`` (YAML or JSON documents read within size, depth and count limits),
``declared`` (model definitions from files: the declared ``catalog.yaml`` and runtime
definition files, parsed and checked as a catalog).

May import ``catalog.errors``, ``catalog.forms``, ``catalog.secrecy``,
``catalog.definition`` and ``catalog.whole``.
"""
