"""The API's routes, one module per area, and who may call them.

Owns the areas (``autoscale``, ``catalog``, ``events``, ``fleet``, ``gateway``,
``health``, ``nodes``, ``service``), the role each kind of route needs (``access``) and
the node report's common case answered before FastAPI's router (``report_fast_path``).

May import every floor of ``llmgw.api`` but ``app``, and ``catalog``, ``events``,
``scheduler``, ``autoscale`` and llmgw's views. ``llmgw.api.app`` mounts them.
"""
