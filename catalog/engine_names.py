"""The engines agents run (``agent.engines`` has an adapter for each).

A leaf of its own so that the model's schema (``catalog.model``) and the load-time check
(``catalog.engines``) share one list without importing each other.
"""

KNOWN_ENGINES = ("vllm", "llamacpp", "sim")
