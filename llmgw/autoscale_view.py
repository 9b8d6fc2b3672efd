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
from autoscale.rolling import Rolling
from autoscale.rounds import summary_for
from autoscale.runner import wanted_counts
from autoscale.store import DECISION, AutoscaleStore
from autoscale.windows import Summary, Window
from catalog import Catalog
from scheduler.daemon.node_service import replica_counts
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.planner.fleet.placements import Placement


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
    received = store.windows(now - policy.window, now)
    windows = Rolling.of(received)
    heard_at = store.heard(now - policy.window, now)
    heard = bool(heard_at)
    seconds = _covered(received, heard_at, policy, now)
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
                "traffic": None if summary is None else _traffic(summary, seconds),
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


def _covered(
    windows: Sequence[Window],
    heard_at: Sequence[datetime],
    policy: Policy,
    now: datetime,
) -> float:
    """The seconds the stored signals cover, at most the policy's window: a gateway that
    started 10 s ago has reported 10 s of traffic, not a minute of it."""
    starts = [w.start for w in windows] + list(heard_at)
    span = min(policy.window, now - min(starts)) if starts else policy.window
    return max(span.total_seconds(), 1.0)


def _traffic(summary: Summary, seconds: float) -> dict[str, Any]:
    """What the gateways measured of a model, as people read it beside its replicas."""
    return {
        "seconds": round(seconds, 1),
        "requests_per_s": round(summary.requests / seconds, 3),
        "errors": summary.errors,
        "inflight": summary.load,
        "inflight_max": summary.inflight_max,
        "waiting": summary.waiting,
        "ttft_p99_s": summary.ttft_p99_s,
        "tpot_p99_s": summary.tpot_p99_s,
        "gateways": summary.gateways,
    }
