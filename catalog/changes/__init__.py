"""What changed between two catalogs, and how to tell them apart.

``diff`` (models added, removed and changed field by field), ``redaction`` (a diff with
secret-looking env values hidden), ``digest`` (a short, stable fingerprint of a
catalog's definitions).

May import the floors below it: ``catalog.errors``, ``catalog.forms``,
``catalog.secrecy``, ``catalog.definition``, ``catalog.whole``.
"""
