"""``llmgw engine-check``: a model's claims held to what a running engine answers.

The catalog's ``capabilities`` and ``context_length`` are what an operator wrote.
This package asks a ready replica: a tool definition and a prompt that needs it
(``tools``), an embeddings call (``embeddings``), the engine's own figure for the
context one request may use (``context_length``). Pure verdicts in ``claims``,
the HTTP in ``probe``; ``tiny_gguf`` writes the small test model the llama.cpp
tests serve.
"""
