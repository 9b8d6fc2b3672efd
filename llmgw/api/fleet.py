"""What runs, per model and per node: the numbers ``/metrics``, ``GET /v1/fleet`` and the
dashboard show, computed from the catalog, the inventory and the placements.

- ``wanted``: the catalog's ``scaling.min``; ``placed``: replicas with a placement;
  ``ready``: placed replicas whose agent reports them ready. Placements carry a
  ``state`` once replica states land; until then ``ready`` is None (not known),
  never a guess.
- A node's GPUs used are the sum of ``gpus_per_node`` of the placements on it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from catalog import Catalog
from scheduler import Node, Placement, StalenessPolicy
from scheduler.staleness import freshness


def replica_state(p: Placement) -> str | None:
    """The replica's reported state, on releases whose placements record one."""
    state = getattr(p, "state", None)
    return None if state is None else str(getattr(state, "value", state))


def models(catalog: Catalog, placements: Sequence[Placement]) -> list[dict[str, Any]]:
    placed = Counter(p.model for p in placements)
    states = [replica_state(p) for p in placements]
    known = any(s is not None for s in states)
    ready = Counter(p.model for p, s in zip(placements, states, strict=True) if s == "ready")
    rows = []
    for m in catalog.models():
        wanted = m.scaling.min
        row: dict[str, Any] = {
            "name": m.name,
            "declared": catalog.is_declared(m.name),
            "wanted": wanted,
            "placed": placed[m.name],
            "ready": ready[m.name] if known else None,
            "unplaced": max(wanted - placed[m.name], 0),
        }
        resilience = getattr(m, "resilience", None)
        if resilience is not None:
            row["resilience"] = str(getattr(resilience, "value", resilience))
        rows.append(row)
    return rows


def nodes(
    inventory: Sequence[Node],
    placements: Sequence[Placement],
    now: datetime,
    policy: StalenessPolicy,
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
        cordoned = getattr(n, "cordoned", None)
        if cordoned is not None:
            row["cordoned"] = bool(cordoned)
        rows.append(row)
    return rows
