"""The gateway's benchmarks: its added latency and CPU per request, side by side.

``side_by_side`` (``python -m bench.gateway``, ``python -m bench gateway``): our gateway,
LiteLLM's proxy and vllm-router in front of one upstream stub, the added latency and CPU
per request and per streamed event; its parts: ``stub`` (the upstream), ``targets``
(what stands in front of it, each started as its docs say), ``control`` (the control
plane our gateway follows), ``load`` (the load generator), ``candidates`` (minimal
pass-throughs on each HTTP stack). ``choice`` (which HTTP server and client the gateway
is built on), ``revocation`` (how long a revoked client token keeps working) and
``slowloris`` (other clients' answers while connections are held without a token,
issue 36) are measurements of their own.

Results: docs/benchmarks/gateway-side-by-side.md; how to run it: docs/benchmarks/gateway.md.
"""
