"""The engines agents run (``agent.engines`` has an adapter for each).

A leaf of its own so that the model's schema (``catalog.definition.model``) and the load-time check
(``catalog.definition.engines``) share one list without importing each other.
"""

KNOWN_ENGINES = ("vllm", "llamacpp", "sim")
