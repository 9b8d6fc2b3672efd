"""Per-model and per-node gauges for ``/metrics``, read from the database at scrape time.

Counters of what this server did (``metrics.Metrics``) say nothing about a cluster
whose rounds another process runs; these gauges are the cluster's state as any
replica of the API reads it, so every replica answers the same numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from llmgw.api import fleet

if TYPE_CHECKING:
    from llmgw.api.services import Services


class FleetCollector(Collector):
    def __init__(self, services: Services) -> None:
        self._svc = services

    def collect(self) -> Iterator[GaugeMetricFamily]:
        svc = self._svc
        placements = svc.nodes.state().placements
        rows = fleet.models(svc.gate.view().catalog, placements)
        families = {
            key: GaugeMetricFamily(
                f"llmgw_model_replicas_{key}", text, labels=["model", "declared"]
            )
            for key, text in (
                ("wanted", "Replicas the catalog asks for (scaling.min), per model."),
                ("placed", "Replicas with a placement, per model."),
                ("ready", "Placed replicas their agent reports ready, per model."),
                ("unplaced", "Replicas wanted but not placed (no room, or no round yet)."),
            )
        }
        for row in rows:
            labels = [row["name"], "true" if row["declared"] else "false"]
            for key, family in families.items():
                if row[key] is not None:
                    family.add_metric(labels, row[key])
        yield from families.values()

        node_rows = fleet.nodes(
            svc.nodes.nodes(), placements, datetime.now(UTC), svc.settings.policy
        )
        by_state = GaugeMetricFamily(
            "llmgw_nodes", "Nodes in the inventory, by freshness state.", labels=["state"]
        )
        counts = Counter(r["state"] for r in node_rows)
        for state in ("fresh", "stale", "lost"):
            by_state.add_metric([state], counts[state])
        yield by_state
        used = GaugeMetricFamily(
            "llmgw_node_gpus_used", "GPUs the placements on a node use.", labels=["node"]
        )
        for r in node_rows:
            used.add_metric([r["name"]], r["gpus_used"])
        yield used
