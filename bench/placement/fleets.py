"""The fleets the placement benches run on: the real openb inventory and synthetic ones.

Shared by ``bench.placement.rounds`` (speed and quality), ``bench.placement.spreadcheck``
(the spread of a plan), ``bench.shared.ab`` and the reference rounds of the unit tests, so
that every one of them measures the same inventories and demands. Pure data: nothing here
plans.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.placement.openb import load_openb_csv, load_openb_pods_csv
from bench.placement.spot import GPU_MEMORY_GB, load_spot_csv
from bench.shared import common
from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
OPENB = common.REPO / "tests" / "data" / "openb_node_list_gpu_node.csv"
OPENB_PODS = common.REPO / "tests" / "data" / "openb_pod_list_gpu.csv"
SPOT = common.REPO / "tests" / "data" / "spot_node_info_df.csv"


def _gpu(
    name: str,
    cls: str,
    gpus: int,
    *,
    priority: int = 0,
    nodes: int = 1,
    memory: int = 0,
    selector: dict[str, str] | None = None,
) -> PlacementProfile:
    return PlacementProfile(
        name=name,
        engine="vllm",
        gpu_class=cls,
        gpus_per_node=gpus,
        nodes=nodes,
        priority=priority,
        node_selector=dict(selector or {}),
        min_memory_gb=memory,
    )


def _cpu(name: str, *, memory: int, selector: dict[str, str] | None = None) -> PlacementProfile:
    return PlacementProfile(
        name=name,
        engine="llamacpp",
        gpu_class=None,
        gpus_per_node=0,
        nodes=1,
        priority=0,
        node_selector=dict(selector or {}),
        min_memory_gb=memory,
    )


# -- the real inventory ---------------------------------------------------------------


def openb_nodes() -> list[Node]:
    return load_openb_csv(OPENB, reported_at=NOW)


def openb_pod_demands(nodes: Sequence[Node]) -> list[Demand]:
    """The trace's own 7,064 GPU pods (``openb_pod_list_default``), each a one-replica model
    that may run on any GPU class of the inventory: 7,433 GPUs asked of 6,212."""
    return load_openb_pods_csv(OPENB_PODS, sorted({n.gpu_class for n in nodes if n.gpu_class}))


def openb_demands() -> list[Demand]:
    """About 6,500 GPUs asked of a fleet of 6,212, in sizes of 1, 2, 4 and 8 cards."""
    return [
        Demand(
            "llama-3.1-70b",
            60,
            (_gpu("g2-tp8", "G2", 8, priority=10), _gpu("v100-tp8", "V100M32", 8, priority=5)),
        ),
        Demand(
            "qwen2.5-7b",
            400,
            (
                _gpu("t4-tp2", "T4", 2, priority=10),
                _gpu("p100-tp2", "P100", 2, priority=5),
                _gpu("g2-tp1", "G2", 1),
            ),
        ),
        Demand(
            "mixtral-8x7b",
            100,
            (
                _gpu("g2-tp4", "G2", 4, priority=10),
                _gpu("v100-tp4", "V100M16", 4, priority=5),
                _gpu("g3-tp4", "G3", 4),
            ),
        ),
        Demand(
            "bge-m3",
            900,
            (
                _gpu("t4", "T4", 1, priority=10),
                _gpu("p100", "P100", 1),
                _gpu("v100", "V100M16", 1),
                _gpu("a10", "A10", 1),
            ),
        ),
        Demand(
            "deepseek-v2-lite",
            200,
            (_gpu("g2-tp8", "G2", 8, priority=10), _gpu("g3-tp8", "G3", 8, priority=5)),
        ),
        Demand("phi-3-mini", 1500, (_gpu("g2-tp1", "G2", 1, priority=10), _gpu("t4-tp1", "T4", 1))),
        Demand(
            "llama-3.1-8b",
            400,
            (_gpu("g2-tp2", "G2", 2, priority=10), _gpu("v100-tp2", "V100M32", 2)),
        ),
    ]


# -- the spot-GPU inventory -------------------------------------------------------------


def spot_nodes() -> list[Node]:
    """The 4,278 nodes of the spot-GPU trace; memory assumed (``bench.placement.spot``)."""
    return load_spot_csv(SPOT, reported_at=NOW)


# The HP demand placed on it: model, GPU memory one replica needs (weights and KV cache,
# GB), host memory per replica (GB), the classes it may use in order of preference, and
# replicas in all. Made up in the spirit of the trace, whose job list is not in the
# repository copy: its HP jobs are mostly one-card ones on A10 and GPU-series-1, with
# 8-card tensor-parallel ones on A100 and H800. Each model's cards per class follow from
# its GPU memory (``_tensor_parallel``), so the per-card figures of ``bench.placement.spot`` decide
# them. The totals ask 10,540 cards of the 10,412 there are (1.2% over, one tier), and
# each shape's preferred class is short while another has room: a placement that takes
# the preferred class for every replica leaves cards idle, so the packing matters.
_SPOT_SHAPES: tuple[tuple[str, int, int, tuple[str, ...], int], ...] = (
    ("chat-8b", 20, 48, ("A10", "GPU-series-1"), 2400),
    ("embed", 8, 32, ("GPU-series-1", "A10"), 650),
    # KV cache offloaded to host memory: 160 GB, so at most 4 per 8-card series-1 node.
    ("chat-8b-long", 20, 160, ("GPU-series-1", "A10"), 200),
    ("chat-14b", 40, 64, ("GPU-series-1", "A100-SXM4-80GB"), 200),
    ("coder-32b", 96, 128, ("GPU-series-1", "A100-SXM4-80GB"), 60),
    ("chat-70b", 400, 384, ("H800", "A100-SXM4-80GB", "A800-SXM4-80GB"), 540),
    ("chat-70b-fp8", 300, 256, ("A100-SXM4-80GB", "A800-SXM4-80GB", "GPU-series-2"), 260),
    # Only the 768 GB hosts (192 vCPUs) hold its 640 GB: H800 and series-2.
    ("moe-fp8", 600, 640, ("H800", "GPU-series-2"), 130),
)


def _tensor_parallel(need_gb: int, cls: str) -> int:
    """The fewest cards (1, 2, 4 or 8) of ``cls`` whose memory holds ``need_gb``."""
    for cards in (1, 2, 4, 8):
        if cards * GPU_MEMORY_GB[cls] >= need_gb:
            return cards
    raise ValueError(f"{need_gb} GB does not fit 8 cards of {cls}")


def spot_demands(fraction: float = 1.0, seed: int = 13) -> list[Demand]:
    """HP models on the spot inventory (``_SPOT_SHAPES``), each shape split into models of
    5 to 60 replicas (seeded, so the same list every time); one priority tier, profile
    priorities 10, 5, 0 in each model's order of preference. ``fraction`` scales every
    shape's replicas (rounded) for a slice of the inventory (``spot_nodes()[::k]``)."""
    rng = random.Random(seed)
    demands = []
    for shape, need, host, classes, total in _SPOT_SHAPES:
        replicas = round(total * fraction)
        profiles = tuple(
            _gpu(
                f"{cls.lower()}-tp{_tensor_parallel(need, cls)}",
                cls,
                _tensor_parallel(need, cls),
                priority=max(10 - 5 * i, 0),
                memory=host,
            )
            for i, cls in enumerate(classes)
        )
        left, i = replicas, 0
        while left > 0:
            count = min(left, rng.randint(5, 60))
            demands.append(Demand(f"{shape}-{i:02d}", count, profiles))
            left -= count
            i += 1
    return demands


# -- synthetic fleets -------------------------------------------------------------------

_CLASSES = (  # class, cards per node, share of GPU nodes
    ("H100", 8, 0.15),
    ("A100", 8, 0.25),
    ("L40S", 4, 0.2),
    ("L4", 2, 0.2),
    ("T4", 1, 0.2),
)


def synthetic_nodes(count: int, seed: int = 7) -> list[Node]:
    """GPU nodes of five classes (10% CPU-only), zones, pools, memory (5% unknown), fabrics
    of 16 nodes for the 8-card classes, a few cards reserved and 1% of nodes stale."""
    rng = random.Random(seed)
    nodes = []
    for i in range(count):
        name = f"node-{i:05d}"
        labels = {"zone": rng.choice(["eu", "us", "ap"]), "pool": rng.choice(["prod", "batch"])}
        memory = None if rng.random() < 0.05 else float(rng.choice([128, 256, 512, 1024]))
        silent = timedelta(seconds=200) if rng.random() < 0.01 else timedelta(0)
        if rng.random() < 0.1:
            labels["pool"] = "cpu"
            nodes.append(Node(name, None, 0, memory, NOW - silent, labels))
            continue
        roll, acc = rng.random(), 0.0
        cls, cards = _CLASSES[-1][:2]
        for c, n, share in _CLASSES:
            acc += share
            if roll < acc:
                cls, cards = c, n
                break
        fabric = f"{cls}-fab-{i // 16}" if cards == 8 else None
        reserved = 1 if rng.random() < 0.03 and cards > 1 else 0
        nodes.append(Node(name, cls, cards, memory, NOW - silent, labels, fabric, reserved))
    return nodes


def synthetic_demands(replicas: int, seed: int = 11) -> list[Demand]:
    """Models of every shape summing to ``replicas`` replicas: 1-8 cards, two-node gangs,
    selectors, memory needs, CPU profiles, two or three profiles each."""
    rng = random.Random(seed)
    shapes: list[tuple[PlacementProfile, ...]] = [
        (_gpu("h100-tp8", "H100", 8, priority=10), _gpu("a100-tp8", "A100", 8, priority=5)),
        (_gpu("h100-2x8", "H100", 8, nodes=2, priority=10), _gpu("a100-2x8", "A100", 8, nodes=2)),
        (_gpu("a100-tp4", "A100", 4, priority=10), _gpu("l40s-tp4", "L40S", 4, priority=5)),
        (
            _gpu("l40s-tp2", "L40S", 2, priority=10, selector={"zone": "eu"}),
            _gpu("l4-tp2", "L4", 2, priority=5, selector={"zone": "eu"}),
        ),
        (_gpu("l4-tp1", "L4", 1, priority=10, memory=64), _gpu("t4", "T4", 1, memory=32)),
        (
            _gpu("t4", "T4", 1, priority=10),
            _gpu("l4", "L4", 1, priority=5),
            _cpu("cpu", memory=16, selector={"pool": "cpu"}),
        ),
        (
            _gpu("a100-tp2", "A100", 2, priority=10, selector={"pool": "prod"}),
            _gpu("h100-tp2", "H100", 2, priority=5, selector={"pool": "prod"}),
        ),
        (_cpu("cpu-small", memory=8),),
    ]
    weights = [3, 1, 4, 6, 10, 12, 5, 4]
    demands = []
    left = replicas
    i = 0
    while left > 0:
        shape = rng.choices(shapes, weights)[0]
        count = min(left, rng.randint(5, 60))
        demands.append(Demand(f"model-{i:04d}", count, shape))
        left -= count
        i += 1
    return demands


def node_report(n: Node) -> dict[str, Any]:
    """What an agent of ``n`` reports (the body ``parse_node_report`` reads)."""
    return {
        "name": n.name,
        "gpu_class": n.gpu_class,
        "gpus": n.gpus,
        "memory_gb": n.memory_gb,
        "labels": dict(n.labels),
        "fabric": n.fabric,
        "gpus_reserved": n.gpus_reserved,
    }
