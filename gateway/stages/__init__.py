"""The request path's stages: pure functions of one request, the table and the load.

``admission`` (the body parsed within bounds, the model resolved, the catalog's limits
applied to one request), ``routing`` (the routing profiles as functions of request,
table and load; slow start), ``setaside`` (failing replicas set aside for a growing
while), ``sse`` (a streamed answer's framing, judged piece by piece as it passes),
``quota`` (a client token's limits: reserve at admission, settle to the engine's usage),
``plausible`` (what an engine's usage may charge: at most what the request could use).
The proxy (``gateway.proxy``) calls them in order; none of them does I/O or knows of the
others' callers.

A new request-path stage (this round: quota, queue, prefix routing) is a module of its
own here that the proxy calls, not a branch inside the proxy or the server.

May import ``catalog`` and ``gateway.table`` (the routing table they read), nothing
else of ours: the floors above (state, proxy, server) build on the stages.
"""
