"""What the catalog asks of the cluster, as the planner's demands: pure, no I/O."""

from __future__ import annotations

from collections.abc import Mapping

from catalog import Catalog
from scheduler.planner.fleet.placements import Demand
from scheduler.planner.rollout import model_lifecycle


def demands(catalog: Catalog, wanted: Mapping[str, int] | None = None) -> list[Demand]:
    """What the catalog asks of the cluster: ``scaling.min`` replicas of each model, with its
    ``placement:`` rules, in catalog order (declared models first), which breaks ties in the
    order models claim hardware (``scheduler.planner.order``).

    ``wanted`` (the autoscaler's counts, ``autoscale.runner.wanted_counts``) replaces
    ``scaling.min`` for the models it names, always held within ``scaling.min..max``."""
    wanted = wanted or {}
    return [
        Demand(
            model=m.name,
            replicas=_within(wanted.get(m.name), m.scaling.min, m.scaling.max),
            profiles=m.placement_profiles(),
            priority=m.placement.priority,
            spread_by=m.placement.spread_by,
            spread_required=m.placement.spread_required,
            lifecycle=model_lifecycle(m),
        )
        for m in catalog.models()
    ]


def _within(wanted: int | None, lo: int, hi: int) -> int:
    if wanted is None:
        return lo
    return min(max(wanted, lo), max(hi, lo))
