"""Placement: the node inventory, the pure planner, and its explanations.

The planner is a function of its inputs only (``plan``); reading reports,
persisting plans and running rounds on a timer live elsewhere.

The names below are loaded on first use (PEP 562): importing one small module
(``scheduler.staleness``) must not load the planner and pydantic's node reports,
since the command line's settings import it for every command.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scheduler.inventory import Node, NodeReport, NodeReportError, parse_node_report
    from scheduler.placements import Demand, Placement, Plan, Removal, Unplaced
    from scheduler.planner import plan
    from scheduler.rejections import ProfileRejections, count_rejections, render, render_profile
    from scheduler.staleness import DEFAULT_STALENESS, Freshness, StalenessPolicy, freshness

_WHERE = {
    "ProfileRejections": "scheduler.rejections",
    "count_rejections": "scheduler.rejections",
    "render": "scheduler.rejections",
    "render_profile": "scheduler.rejections",
    "Node": "scheduler.inventory",
    "NodeReport": "scheduler.inventory",
    "NodeReportError": "scheduler.inventory",
    "parse_node_report": "scheduler.inventory",
    "Demand": "scheduler.placements",
    "Placement": "scheduler.placements",
    "Plan": "scheduler.placements",
    "Removal": "scheduler.placements",
    "Unplaced": "scheduler.placements",
    "plan": "scheduler.planner",
    "DEFAULT_STALENESS": "scheduler.staleness",
    "Freshness": "scheduler.staleness",
    "StalenessPolicy": "scheduler.staleness",
    "freshness": "scheduler.staleness",
}

__all__ = [
    "DEFAULT_STALENESS",
    "Demand",
    "Freshness",
    "Node",
    "NodeReport",
    "NodeReportError",
    "Placement",
    "Plan",
    "ProfileRejections",
    "Removal",
    "StalenessPolicy",
    "Unplaced",
    "count_rejections",
    "freshness",
    "parse_node_report",
    "plan",
    "render",
    "render_profile",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # once: the next lookup is a plain module attribute
    return value
