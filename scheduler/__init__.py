"""Placement: the node inventory, the pure planner, and its explanations.

The planner is a function of its inputs only (``plan``); reading reports,
persisting plans and running rounds on a timer live elsewhere.
"""

from scheduler.inventory import Node, NodeReport, NodeReportError, parse_node_report
from scheduler.placements import Demand, Placement, Plan, Removal, Unplaced
from scheduler.planner import plan
from scheduler.rejections import ProfileRejections, count_rejections, render, render_profile
from scheduler.staleness import DEFAULT_STALENESS, Freshness, StalenessPolicy, freshness

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
