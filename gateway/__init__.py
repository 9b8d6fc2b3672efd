"""The data plane: ``llmgw gateway``, OpenAI traffic to the catalog's ready replicas.

Pure parts (no I/O): ``table`` (the routing table built from the control plane's feeds),
``admission`` (resolution and the catalog's limits applied to one request), ``routing``
(the routing profiles as functions of request, table and load), ``setaside`` (failing
replicas set aside for a growing while), ``windows`` (the signal windows for the
autoscaler). I/O at the edges: ``server`` (HTTP), ``upstream`` and ``enginepool`` (the engines),
``follower`` (the control plane), ``signals`` (posting windows).

It talks to the control plane over HTTP only, and imports nothing of ours but
``catalog`` (pure rules and types).
"""
