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

import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError

from llmgw.api.runtime import fleet_counts

if TYPE_CHECKING:
    from llmgw.api.runtime.services import Services

log = structlog.get_logger("llmgw.api")


class FleetCollector(Collector):
    def __init__(self, services: Services) -> None:
        self._svc = services

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The names alone: registering must not read the database (nor fail with it)."""
        yield from self._families().values()
        yield from self._node_families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        # A database that cannot be read leaves these gauges out of the page rather than
        # failing it: the server's own metrics still say what is wrong.
        try:
            families = list(self._collect())
        except SQLAlchemyError as exc:
            log.warning("api.metrics_unavailable", error=str(exc).splitlines()[0])
            return
        yield from families

    def _families(self) -> dict[str, GaugeMetricFamily]:
        return {
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

    @staticmethod
    def _node_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "llmgw_nodes", "Nodes in the inventory, by freshness state.", labels=["state"]
            ),
            GaugeMetricFamily(
                "llmgw_node_gpus_used", "GPUs the placements on a node use.", labels=["node"]
            ),
        )

    def _collect(self) -> Iterator[GaugeMetricFamily]:
        svc = self._svc
        replicas = svc.nodes.replicas()
        placements = [p for p, _ in replicas]
        rows = fleet_counts.models(svc.gate.view().catalog, replicas)
        families = self._families()
        for row in rows:
            labels = [row["name"], "true" if row["declared"] else "false"]
            for key, family in families.items():
                if row[key] is not None:
                    family.add_metric(labels, row[key])
        yield from families.values()

        node_rows = fleet_counts.nodes(
            svc.nodes.nodes(), placements, datetime.now(UTC), svc.settings.policy
        )
        by_state, used = self._node_families()
        counts = Counter(r["state"] for r in node_rows)
        for state in ("fresh", "stale", "lost"):
            by_state.add_metric([state], counts[state])
        yield by_state
        for r in node_rows:
            used.add_metric([r["name"]], r["gpus_used"])
        yield used
