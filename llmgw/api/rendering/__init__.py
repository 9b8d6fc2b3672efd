"""What the API answers with: errors, OpenAI's shapes, the response schemas.

Owns errors as ``application/problem+json`` (``problems``), what OpenAI's clients
expect of ``/v1/models`` (``openai``) and the response shapes of the OpenAPI document
(``schemas``).

May import ``catalog`` and ``events``; nothing else of ``llmgw.api``: every other floor
renders with it.
"""
