"""Stored definitions decoded fast: the rows replay reads, at msgspec's speed.

``stored_shapes`` (the shapes a stored definition's JSON may take, as msgspec
Structs), ``fast_build`` (pydantic models built from them without validating twice),
``fast_decode`` (the decoder replay tries first; anything it does not recognise goes
to ``catalog.definition.parse``, the validator).

May import ``catalog.errors``, ``catalog.forms``, ``catalog.definition`` and
``catalog.reading`` (the bounded JSON reader).
"""
