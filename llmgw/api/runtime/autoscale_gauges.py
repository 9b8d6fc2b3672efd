"""Per-model autoscaling gauges for ``/metrics``, read from the database at scrape time:
current vs wanted vs min/max, the load against capacity, and the p99s against the SLO."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError

from autoscale.store import AutoscaleStore
from llmgw.autoscale_view import autoscale_rows

if TYPE_CHECKING:
    from llmgw.api.runtime.services import Services

log = structlog.get_logger("llmgw.api")

GAUGES = (
    ("wanted_replicas", "Replicas the autoscaler asks for (scaling.min when it has not)."),
    ("min_replicas", "The model's scaling.min."),
    ("max_replicas", "The model's scaling.max."),
    ("load", "Concurrent requests over the last window, all gateways."),
    ("capacity", "Concurrent requests one replica carries within the SLO (bench or default)."),
    ("ttft_p99_seconds", "The highest gateway-window TTFT p99 over the last window."),
    ("tpot_p99_seconds", "The highest gateway-window TPOT p99 over the last window."),
    ("slo_ttft_p99_seconds", "The model's slo.ttft_p99."),
    ("slo_tpot_p99_seconds", "The model's slo.tpot_p99."),
)


def _values(row: dict[str, Any]) -> dict[str, float | None]:
    signals = row["signals"] or {}
    return {
        "wanted_replicas": row["wanted"],
        "min_replicas": row["min"],
        "max_replicas": row["max"],
        "load": signals.get("load"),
        "capacity": row["capacity"],
        "ttft_p99_seconds": signals.get("ttft_p99_s"),
        "tpot_p99_seconds": signals.get("tpot_p99_s"),
        "slo_ttft_p99_seconds": row["slo"]["ttft_p99_s"],
        "slo_tpot_p99_seconds": row["slo"]["tpot_p99_s"],
    }


class AutoscaleCollector(Collector):
    def __init__(self, services: Services) -> None:
        self._svc = services

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        return {
            key: GaugeMetricFamily(f"llmgw_autoscale_{key}", text, labels=["model"])
            for key, text in GAUGES
        }

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families().values()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        svc = self._svc
        try:
            rows = autoscale_rows(
                svc.gate.view().catalog,
                svc.nodes.replicas(),
                AutoscaleStore(svc.engine),
                svc.settings.autoscale,
                datetime.now(UTC),
            )
        except SQLAlchemyError as exc:
            log.warning("api.metrics_unavailable", error=str(exc).splitlines()[0])
            return
        families = self._families()
        for row in rows:
            for key, value in _values(row).items():
                if value is not None:
                    families[key].add_metric([row["model"]], value)
        yield from families.values()
