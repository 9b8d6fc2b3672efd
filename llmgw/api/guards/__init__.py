"""What a request must pass before any service sees it.

Owns bearer tokens and roles, stored hashed (``tokens``), request bodies held to what
the database can store (``bodies``) and unknown query parameters refused
(``queries``). Which role each route needs is ``llmgw.api.routes.access``.

May import ``catalog`` and ``llmgw.api.rendering``; never ``llmgw.api.runtime``.
"""
