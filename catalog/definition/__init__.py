"""One model's definition and its own rules, and the names it may use.

``model`` (the pydantic model: what a model is, how it runs, how many copies),
``model_rules`` (its defaults and checks), ``parse`` (raw data to a normalised,
validated model), ``views`` (what other parts see of its profiles), ``identifiers``
(the one grammar of every stored name), ``engine_names`` and ``engines`` (the engines
a profile may name), ``routing_profiles`` (the routing profiles a model may name).

May import ``catalog.errors``, ``catalog.forms`` and ``catalog.secrecy``; the rules
between models (``catalog.whole``) build on it.
"""
