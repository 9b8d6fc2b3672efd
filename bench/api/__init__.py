"""The API's and the command line's benchmarks: requests a server takes, what a start costs.

``reports`` (node reports a second into one ``llmgw serve``), ``batch`` (a batch of
reports' replica counts, apart from HTTP), ``headers`` (what bounding request heads
costs), ``fleet_ab`` (``GET /v1/fleet``'s body at another commit and here), ``startup``
(the CPU of starting each kind of process), ``logcall`` (one structured log call on
the production path), ``stream_replicas`` (a write through one replica seen on another's
event stream), ``redaction`` (what hiding secrets in env and args costs a read) and
``heartbeats`` (a fleet's heartbeats as node leases beside today's full reports: ``python
-m bench heartbeats``).

Results: docs/benchmarks/node-reports.md, docs/benchmarks/request-limits.md,
docs/benchmarks/placement.md (``fleet_ab``), docs/benchmarks/profiles-and-changes.md,
docs/operator/api.md (``stream_replicas``),
docs/security/hostile-input-agent-and-headers.md (``redaction``) and
docs/benchmarks/heartbeats.md (``heartbeats``).
"""
