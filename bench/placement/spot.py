"""Reading the Alibaba spot-GPU node list as an inventory.

The trace (``cluster-trace-v2026-spot-gpu/node_info_df.csv``) is the 4,278 GPU nodes of a
production cluster serving high-priority (HP) and spot jobs, with 6 card types: a second
real inventory beside openb, and a different one (3,396 of its nodes have a single card;
the others 4 or 8). Kept apart from the planner because it reads files.

Source and terms: ``cluster-trace-v2026-spot-gpu`` of github.com/alibaba/clusterdata (Duan
et al., "GFS: A Preemptive Scheduling Framework for GPU Clusters with Predictive Spot
Management", ASPLOS '26). No licence is stated: the repository has no licence file and
allows use "for research or study purpose"; the file in tests/data is used here for study
only and is not part of the package. See tests/data/README.md. The trace's job list
(``job_info_df.csv``) is not in the repository copy we read (its blob is absent), so the
demand placed on this inventory (``bench.placement.fleets.spot_demands``) is made up, not
the trace's.

The file has four columns, ``gpu_model,gpu_capacity_num,cpu_num,node_name``: no memory
of any kind. What the loader assumes, every figure measured on this inventory resting on it:

- **Host memory** (``Node.memory_gb``, what a profile's ``min_memory_gb`` is held to):
  ``HOST_GB_PER_VCPU`` = 4 GB per vCPU, the 1:4 ratio of general-purpose cloud instances
  (128 vCPUs: 512 GB, 192 vCPUs: 768 GB). Not from the trace. GPU hosts often have more per
  vCPU, so if anything the memory limit binds more here than in the real cluster.
- **GPU memory per card** (``GPU_MEMORY_GB``), which the planner does not model: a node
  carries it as the label ``gpu-memory-gb`` (informative; no profile selects on it), and
  ``bench.placement.fleets.spot_demands`` uses it to choose each model's tensor-parallel size per
  class. Public for A10 (24 GB), A100-SXM4-80GB and A800-SXM4-80GB (80 GB, in the names)
  and H800 (80 GB, the SXM part). ``GPU-series-1`` and ``GPU-series-2`` are undisclosed in
  the trace; assumed **24 GB** for series-1 (its nodes have the A10 nodes' shape, mostly one
  card each, and the HP jobs' one-card replicas run on both) and **80 GB** for series-2
  (8 cards on 192-vCPU hosts, the H800 nodes' shape). If series-2 had less, the models
  that list it would need more cards there or could not use it at all.
- Every node is stamped ``reported_at`` (fresh); no labels but ``gpu-memory-gb``, no
  fabrics (the trace names none), no reserved cards.
- Node names: ``spot-`` and the trace's ``node_name`` zero-padded to 4 digits, so that the
  name order (the planner's and the exact program's tie-break) is the trace's order.
"""

from __future__ import annotations

import csv
import os
from datetime import UTC, datetime

from scheduler.planner.fleet.inventory import Node

HOST_GB_PER_VCPU = 4
GPU_MEMORY_GB: dict[str, int] = {
    "A10": 24,
    "A100-SXM4-80GB": 80,
    "A800-SXM4-80GB": 80,
    "H800": 80,
    "GPU-series-1": 24,  # assumed: undisclosed (see module)
    "GPU-series-2": 80,  # assumed: undisclosed (see module)
}
GPU_MEMORY_LABEL = "gpu-memory-gb"


def load_spot_csv(
    path: str | os.PathLike[str], *, reported_at: datetime | None = None
) -> list[Node]:
    """Nodes from a CSV with columns ``gpu_model,gpu_capacity_num,cpu_num,node_name``.

    Host memory and GPU memory per card are assumptions (see module); a card type not in
    ``GPU_MEMORY_GB`` is refused rather than given a made-up figure silently.
    """
    stamp = reported_at if reported_at is not None else datetime.now(UTC)
    with open(path, newline="", encoding="utf-8") as handle:
        return [_node(row, stamp) for row in csv.DictReader(handle)]


def _node(row: dict[str, str], reported_at: datetime) -> Node:
    model = row["gpu_model"]
    if model not in GPU_MEMORY_GB:
        raise ValueError(
            f"spot node {row['node_name']}: card type {model!r} has no GPU memory in "
            "bench.placement.spot.GPU_MEMORY_GB; add it (with its source) before loading"
        )
    return Node(
        name=f"spot-{int(row['node_name']):04d}",
        gpu_class=model,
        gpus=int(row["gpu_capacity_num"]),
        memory_gb=float(int(row["cpu_num"]) * HOST_GB_PER_VCPU),
        reported_at=reported_at,
        labels={GPU_MEMORY_LABEL: str(GPU_MEMORY_GB[model])},
    )
