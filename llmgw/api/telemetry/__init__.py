"""What the API tells about itself: Prometheus metrics and one log line per request.

Owns the app's metrics registry (``metrics``) and the request middleware that logs
``api.request`` and counts the HTTP metrics (``request_log``). The gauges read from the
database at scrape time need the services, so they live in ``llmgw.api.runtime``.

May import ``declared`` and ``scheduler`` (the names of what it counts); nothing of
``llmgw.api``.
"""
