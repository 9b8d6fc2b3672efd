"""Small builders for placement tests: nodes, profiles and demands with sane defaults.

Each test states only what matters to it; everything else defaults to a fresh
8-card A100 node, or an 8-card A100 profile on one node.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from catalog.definition.views import PlacementProfile
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement, Plan
from scheduler.planner.plan import plan

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

_HERE = Path(__file__).resolve()
# Prefer the copy inside the repository, so the tests do not depend on a
# checkout of the shared directory beside it.
OPENB_CSV_CANDIDATES = (
    _HERE.parents[2] / "data" / "openb_node_list_gpu_node.csv",
    _HERE.parents[3] / ".." / "shared" / "data" / "openb_node_list_gpu_node.csv",
)


def node(
    name: str,
    gpu_class: str | None = "A100",
    gpus: int = 8,
    *,
    memory_gb: float | None = None,
    labels: Mapping[str, str] | None = None,
    fabric: str | None = None,
    reserved: int = 0,
    silent_for: timedelta = timedelta(0),
) -> Node:
    return Node(
        name=name,
        gpu_class=gpu_class,
        gpus=gpus if gpu_class is not None else 0,
        memory_gb=memory_gb,
        reported_at=NOW - silent_for,
        labels=dict(labels or {}),
        fabric=fabric,
        gpus_reserved=reserved,
    )


def cpu_node(
    name: str, *, memory_gb: float | None = None, labels: Mapping[str, str] | None = None
) -> Node:
    return node(name, None, 0, memory_gb=memory_gb, labels=labels)


def profile(
    name: str = "a100x8",
    gpu_class: str | None = "A100",
    gpus: int = 8,
    *,
    nodes: int = 1,
    priority: int = 0,
    selector: Mapping[str, str] | None = None,
    memory_gb: int = 0,
) -> PlacementProfile:
    return PlacementProfile(
        name=name,
        engine="vllm" if gpu_class is not None else "llamacpp",
        gpu_class=gpu_class,
        gpus_per_node=gpus if gpu_class is not None else 0,
        nodes=nodes,
        priority=priority,
        node_selector=dict(selector or {}),
        min_memory_gb=memory_gb,
    )


def cpu_profile(
    name: str = "cpu",
    *,
    priority: int = 0,
    selector: Mapping[str, str] | None = None,
    memory_gb: int = 0,
) -> PlacementProfile:
    return profile(name, None, 0, priority=priority, selector=selector, memory_gb=memory_gb)


def demand(model: str, replicas: int, *profiles: PlacementProfile) -> Demand:
    return Demand(model=model, replicas=replicas, profiles=profiles or (profile(),))


def run(
    demands: Sequence[Demand],
    nodes: Sequence[Node],
    current: Sequence[Placement] = (),
    *,
    now: datetime = NOW,
    policy: StalenessPolicy | None = None,
) -> Plan:
    if policy is None:
        return plan(demands, nodes, current, now)
    return plan(demands, nodes, current, now, policy)


def overcommitted(placements: Sequence[Placement], nodes: Sequence[Node]) -> list[str]:
    """Every node whose GPUs (reserved included) or known memory the placements exceed."""
    gpus: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    for p in placements:
        for name in p.nodes:
            gpus[name] += p.gpus_per_node
            memory[name] += p.memory_gb_per_node
    problems = []
    for n in nodes:
        if gpus[n.name] and gpus[n.name] > n.gpus - n.gpus_reserved:
            problems.append(f"{n.name}: {gpus[n.name]} GPUs of {n.gpus - n.gpus_reserved}")
        if n.memory_gb is not None and memory[n.name] > n.memory_gb:
            problems.append(f"{n.name}: {memory[n.name]} GB of {n.memory_gb}")
    return problems


def hosts(result: Plan, model: str) -> list[tuple[str, ...]]:
    """The nodes of each of a model's placements after the plan, by replica."""
    return [p.nodes for p in result.placements if p.model == model]
