"""The control plane's HTTP API (``llmgw serve``): the same commands as the CLI, over the network.

Agents do not hold database credentials: they report to the control plane,
and operators and tools talk to it the same way. Every route calls the same
commands the CLI calls (``CatalogService.add``/``remove``,
``SchedulerStore.report``, ...); no rule of the catalog or the scheduler is
written here.

Here: ``app`` (the factory that composes the floors below) and ``server`` (uvicorn).
Floors, from the ground up: ``rendering`` (problem+json errors, OpenAI's shapes, the
response schemas), ``telemetry`` (the metrics registry, the request log), ``guards``
(bearer tokens, request bodies, query parameters), ``pages`` (``/docs``, ``/manual``,
``/ui``), ``reports`` (agents' node reports, group commit), ``runtime`` (the services,
settings and scheduler thread of a running server, and the gauges read from them) and
``routes`` (one module per area, with ``access``, the roles per route). Importing this
package imports no web framework: the CLI reads ``guards.tokens`` for ``llmgw token
new`` without paying for FastAPI.
"""
