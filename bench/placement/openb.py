"""Reading the Alibaba ``openb`` GPU node list as an inventory.

The trace (``cluster-trace-gpu-v2023``) is a real, heterogeneous production
cluster, which makes it a better test of placement and of its explanations
than anything made up. Kept apart from the planner because it reads files.

Source and terms: ``cluster-trace-gpu-v2023/csv`` of github.com/alibaba/clusterdata
(Weng et al., USENIX ATC '23). No licence is stated: the repository has no licence
file and allows use "for research or study purpose"; the files in tests/data are used
here for study only and are not part of the package. See tests/data/README.md.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from datetime import UTC, datetime

from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand

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


def load_openb_pods_csv(path: str | os.PathLike[str], classes: Sequence[str]) -> list[Demand]:
    """The GPU pods of an openb pod list as one-replica models, in the trace's order.

    Columns ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec``. A pod
    with no ``gpu_spec`` runs on any card, so it gets one profile per class in
    ``classes`` (all of one priority: declaration order breaks the tie); one
    with a spec, one profile per class it names (``|``-separated). A pod asking
    for a fraction of a card (``gpu_milli`` below 1000) gets a whole one: the
    planner does not share cards. Memory is rounded up to whole GB.
    """
    with open(path, newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if int(r["num_gpu"]) > 0]
    demands = []
    for row in rows:
        named = [c for c in row["gpu_spec"].split("|") if c] or list(classes)
        gpus = int(row["num_gpu"])
        memory = -(-int(row["memory_mib"]) // _MIB_PER_GB)
        profiles = tuple(
            PlacementProfile(
                name=cls.lower(),
                engine="vllm",
                gpu_class=cls,
                gpus_per_node=gpus,
                nodes=1,
                priority=0,
                min_memory_gb=memory,
            )
            for cls in named
        )
        demands.append(Demand(row["name"], 1, profiles))
    return demands
