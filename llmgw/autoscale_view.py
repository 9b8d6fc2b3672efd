"""Per model: current vs wanted vs min/max, the last decision, and the recent load.

What ``llmgw status``, ``GET /v1/autoscale`` and the dashboard show, computed in one
place from the catalog, the placements and the autoscaler's store.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from autoscale.limits import model_limits
from autoscale.policy import Policy
from autoscale.rounds import group, summary_for
from autoscale.runner import wanted_counts
from autoscale.store import DECISION, AutoscaleStore
from catalog import Catalog
from scheduler.daemon.node_service import replica_counts
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.planner.placements import Placement


def autoscale_rows(
    catalog: Catalog,
    replicas: Sequence[tuple[Placement, ReplicaStatus]],
    store: AutoscaleStore,
    policy: Policy,
    now: datetime,
) -> list[dict[str, Any]]:
    counts = replica_counts(catalog, replicas)
    wanted = wanted_counts(store, policy)
    last = store.latest(DECISION)
    limits = model_limits(catalog.models(), store.capacities())
    windows = group(store.windows(now - policy.window, now))
    heard = bool(store.heard(now - policy.window, now))
    rows = []
    for m in catalog.models():
        c, lim, own = counts[m.name], limits[m.name], policy.for_model(m.name)
        summary = summary_for(m.name, windows, heard)
        decision = last.get(m.name)
        want = wanted.get(m.name, m.scaling.min)
        rows.append(
            {
                "model": m.name,
                "min": m.scaling.min,
                "max": m.scaling.max,
                "wanted": min(max(want, m.scaling.min), max(m.scaling.max, m.scaling.min)),
                "placed": c.placed,
                "ready": c.ready,
                "autoscaled": own.enabled,
                "capacity": lim.capacity or own.default_capacity,
                "capacity_source": lim.capacity_source,
                "slo": {"ttft_p99_s": lim.ttft_p99_s, "tpot_p99_s": lim.tpot_p99_s},
                "signals": None if summary is None else summary.to_json(),
                "last_decision": None
                if decision is None
                else {
                    "at": decision.recorded_at.isoformat(),
                    "current": decision.body.get("current"),
                    "wanted": decision.body.get("wanted"),
                    "code": decision.body.get("code"),
                    "reason": decision.body.get("reason"),
                },
            }
        )
    return rows
