"""The data plane: ``llmgw gateway``, OpenAI traffic to the catalog's ready replicas.

Pure parts (no I/O): ``table`` (the routing table built from the control plane's feeds),
``stages`` (the request path's stages, each a module the proxy calls: ``admission``,
``routing``, ``setaside``; a new stage goes there), ``windows`` (the signal windows for
the autoscaler). I/O at the edges: ``proxy`` (one request through the stages to an
engine), ``server`` (HTTP), ``upstream`` and ``enginepool`` (the engines), ``follower``
(the control plane), ``signals`` (posting windows).

It talks to the control plane over HTTP only, and imports nothing of ours but
``catalog`` (pure rules and types).
"""
