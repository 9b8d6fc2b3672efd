"""Running the system: serve, token, agent, engine-check, status.

Owns their arguments and help, with ``settings`` and ``completion`` (``parser``), the
API server and its tokens (``serve``, ``token_file``), the node agent (``agent``),
``llmgw engine-check`` (``engine_check``) and the control plane at a glance
(``status``).

May import ``agent``, ``catalog``, ``declared``, ``engine_check``, ``events``,
``scheduler``, ``llmgw.api``, llmgw's settings and views, ``llmgw.cli.shared``,
``llmgw.cli.scheduler`` and ``llmgw.cli.autoscale``.
"""
