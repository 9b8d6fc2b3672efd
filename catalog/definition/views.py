"""What other parts of the system see of a model's profiles.

The placement planner and the engine adapters each need a narrow, stable view
of a profile rather than the whole definition: the planner must not start
depending on engine arguments, and an engine adapter has no business with
priorities. Both views are plain frozen dataclasses so that code consuming
them (the planner above all) stays free of pydantic and of the catalog rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PlacementProfile:
    """How one profile of a model asks for hardware.

    ``gpu_class`` is None for a CPU profile (an engine that can serve without a
    card, with no class named); ``gpus_per_node`` is then 0.
    """

    name: str
    engine: str
    gpu_class: str | None
    gpus_per_node: int
    nodes: int
    priority: int
    node_selector: Mapping[str, str] = field(default_factory=dict)
    min_memory_gb: int = 0

    @property
    def cpu_only(self) -> bool:
        return self.gpu_class is None


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """What an engine adapter needs to start one replica of a model."""

    name: str
    engine: str
    gpu_class: str | None
    tp: int
    pp: int
    gpus_per_node: int
    nodes: int
    args: tuple[str, ...]
    # A plain value, or {"secret": name}: the agent resolves the name on its node.
    env: Mapping[str, str | Mapping[str, str]]
    model_path: str
    served_model_name: str
