"""What the catalog asks of the cluster, as the planner's demands: pure, no I/O."""

from __future__ import annotations

from catalog import Catalog
from scheduler.planner.placements import Demand
from scheduler.planner.rollout import model_lifecycle


def demands(catalog: Catalog) -> list[Demand]:
    """What the catalog asks of the cluster: ``scaling.min`` replicas of each model, with its
    ``placement:`` rules, in catalog order (declared models first), which breaks ties in the
    order models claim hardware (``scheduler.planner.order``)."""
    return [
        Demand(
            model=m.name,
            replicas=m.scaling.min,
            profiles=m.placement_profiles(),
            priority=m.placement.priority,
            spread_by=m.placement.spread_by,
            spread_required=m.placement.spread_required,
            lifecycle=model_lifecycle(m),
        )
        for m in catalog.models()
    ]
