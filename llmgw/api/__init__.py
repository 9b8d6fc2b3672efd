"""The control plane's HTTP API (``llmgw serve``): the same commands as the CLI, over the network.

Agents do not hold database credentials: they report to the control plane,
and operators and tools talk to it the same way. Every route calls the same
commands the CLI calls (``CatalogService.add``/``remove``,
``SchedulerStore.report``, ...); no rule of the catalog or the scheduler is
written here.

Modules: ``app`` (the factory), ``auth`` and ``access`` (bearer tokens and
roles), ``settings``, ``problems`` (RFC 9457 errors), ``services`` (the guarded
catalog), ``bodies`` and ``views`` (what goes in and out), ``metrics``,
``middleware``, ``background`` (the scheduler inside ``serve``) and
``routes``. Importing this package imports no web framework: the CLI reads
``auth`` for ``llmgw token new`` without paying for FastAPI.
"""
