"""A running API server's state: its services, settings and background work.

Owns what the routes work with (``services``: the stores and the guarded catalog),
what ``llmgw serve`` is configured with (``settings``), the placement scheduler inside
``serve --with-scheduler`` (``scheduler_thread``), what runs per model and node
(``fleet_counts``) and the gauges ``/metrics`` reads from the database at scrape time
(``fleet_gauges``, ``autoscale_gauges``).

May import ``catalog``, ``events``, ``scheduler``, ``autoscale``, ``declared``,
llmgw's settings and views, and ``llmgw.api``'s ``guards``, ``rendering``, ``reports``
and ``telemetry``; never ``llmgw.api.routes``.
"""
