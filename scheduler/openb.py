"""Reading the Alibaba ``openb`` GPU node list as an inventory.

The trace (``cluster-trace-gpu-v2023``) is a real, heterogeneous production
cluster, which makes it a better test of placement and of its explanations
than anything made up. Kept apart from the planner because it reads files.
"""

from __future__ import annotations

import csv
import os
from datetime import UTC, datetime

from scheduler.inventory import Node

_MIB_PER_GB = 1024


def load_openb_csv(
    path: str | os.PathLike[str], *, reported_at: datetime | None = None
) -> list[Node]:
    """Nodes from a CSV with columns ``sn,cpu_milli,memory_mib,gpu,model``.

    The trace says nothing about when nodes reported, so every node is stamped
    ``reported_at`` (now, unless given): it is an inventory of fresh nodes.
    The trace has no labels or fabrics either; callers that need them add them.
    """
    stamp = reported_at if reported_at is not None else datetime.now(UTC)
    with open(path, newline="", encoding="utf-8") as handle:
        return [_node(row, stamp) for row in csv.DictReader(handle)]


def _node(row: dict[str, str], reported_at: datetime) -> Node:
    gpus = int(row["gpu"])
    return Node(
        name=row["sn"],
        gpu_class=(row["model"] or None) if gpus > 0 else None,
        gpus=gpus,
        memory_gb=int(row["memory_mib"]) / _MIB_PER_GB,
        reported_at=reported_at,
    )
