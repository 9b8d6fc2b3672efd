"""What runs, per model and per node: the numbers ``/metrics``, ``GET /v1/fleet`` and the
dashboard show, computed from the catalog, the inventory and the placements.

- ``wanted``: the catalog's ``scaling.min``; ``placed``: replicas with a placement;
  ``ready``: placed replicas whose agent reports them ready, or whose agent does not
  report replica states at all (``scheduler.replica_counts``, as ``llmgw models``).
- A node's GPUs used are the sum of ``gpus_per_node`` of the placements on it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from catalog import Catalog
from scheduler.daemon.node_service import replica_counts
from scheduler.lifecycle.inputs import Cordon
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.lifecycle.staleness import StalenessPolicy, freshness
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Placement


def models(
    catalog: Catalog, replicas: Sequence[tuple[Placement, ReplicaStatus]]
) -> list[dict[str, Any]]:
    """Per model: wanted, placed, ready (as ``llmgw models``) and unplaced."""
    counts = replica_counts(catalog, replicas)
    rows = []
    for m in catalog.models():
        c = counts[m.name]
        rows.append(
            {
                "name": m.name,
                "declared": catalog.is_declared(m.name),
                "wanted": c.wanted,
                "placed": c.placed,
                "ready": c.ready,
                "unplaced": max(c.wanted - c.placed, 0),
            }
        )
    return rows


def nodes(
    inventory: Sequence[Node],
    placements: Sequence[Placement],
    now: datetime,
    policy: StalenessPolicy,
    cordons: Mapping[str, Cordon] | None = None,
) -> list[dict[str, Any]]:
    used: Counter[str] = Counter()
    replicas: Counter[str] = Counter()
    for p in placements:
        for name in p.nodes:
            used[name] += p.gpus_per_node
            replicas[name] += 1
    rows = []
    for n in inventory:
        row: dict[str, Any] = {
            "name": n.name,
            "gpu_class": n.gpu_class,
            "gpus": n.gpus,
            "gpus_reserved": n.gpus_reserved,
            "gpus_used": used[n.name],
            "gpus_free": max(n.gpus - n.gpus_reserved - used[n.name], 0),
            "replicas": replicas[n.name],
            "state": freshness(n.reported_at, now, policy).value,
        }
        cordon = (cordons or {}).get(n.name)
        row["cordoned"] = cordon is not None
        row["cordon"] = None if cordon is None else cordon.mode
        rows.append(row)
    return rows
