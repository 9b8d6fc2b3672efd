"""The API's pages for people, served offline: ``/docs``, ``/manual`` and ``/ui``.

Owns Swagger UI from the ``swagger-ui-py`` package (``swagger_ui``), the built
documentation site (``manual``) and the web dashboard's static files (``dashboard``).

May import ``llmgw.api.rendering`` only.
"""
