"""The metrics reference page: every family ``GET /metrics`` exports, from the code.

The server's own metrics come from ``llmgw.api.telemetry.metrics.Metrics``' registry; the fleet's
(read from the database at scrape time) from ``FleetCollector`` over a fresh, migrated
SQLite file, which yields every family with its help and labels and no samples.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Family = tuple[str, str, str, tuple[str, ...]]


def families() -> list[Family]:
    from catalog import Catalog
    from events.database.connection import make_engine
    from events.database.migrate import ensure_schema
    from llmgw.api.runtime.fleet_gauges import FleetCollector
    from llmgw.api.runtime.services import Services
    from llmgw.api.runtime.settings import ApiSettings
    from llmgw.api.telemetry.metrics import Metrics

    found: list[Family] = []
    metrics = Metrics()
    for collector in list(metrics.registry._collector_to_names):
        # A labelled metric describes its family without labels; its wrapper knows them.
        labels = tuple(getattr(collector, "_labelnames", ()))
        described = collector.describe()  # type: ignore[attr-defined]
        found += [(*f[:3], f[3] or labels) for f in _described(described)]
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'metrics.db'}")
        try:
            ensure_schema(engine)
            svc = Services.build(engine, Catalog.build([]), "catalog.yaml", ApiSettings())
            found += _described(FleetCollector(svc).collect())
        finally:
            engine.dispose()
    return found


def _described(metrics: Iterable[Any]) -> list[Family]:
    return [
        (m.name, m.type, m.documentation, tuple(getattr(m, "_labelnames", ()) or ()))
        for m in metrics
    ]


def render() -> str:
    lines = [
        "# Metrics reference",
        "",
        "Generated from the code when this site was built: every family `GET /metrics` "
        "exports (Prometheus text format; counters gain `_total`, histograms `_bucket`, "
        "`_sum` and `_count`). The server's own metrics count what this process did; the "
        "cluster's (`llmgw_model_replicas_*`, `llmgw_nodes`, `llmgw_node_gpus_used`) are read "
        "from the database at scrape time, so every API replica answers the same numbers. "
        "How to read them, and what to alert on: [Monitoring](../operator/monitoring.md).",
        "",
        "| metric | type | labels | meaning |",
        "|---|---|---|---|",
    ]
    for name, kind, doc, labels in families():
        shown = ", ".join(f"`{label}`" for label in labels) or "-"
        text = doc.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{name}` | {kind} | {shown} | {text} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render())
