"""Secrets in a profile's ``env``: held by reference, never by value.

``secret_words`` (the words of the rule, shared with the model's schema), ``secrets``
(the check, and redaction of secret-looking values). A catalog diff with those values
hidden is ``catalog.changes.redaction``, a floor above.

May import ``catalog.errors`` only: the model's definition builds on it.
"""
