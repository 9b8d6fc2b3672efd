"""Whether one node can host one profile, and if not, the first reason why.

The checks run in a fixed order (``Check``) so that an explanation counts each
rejected node exactly once, under the first check it fails, and so that the
same node always gives the same reason.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.inventory import Node


class Check(enum.IntEnum):
    """The fit checks, in the order they are applied and reported."""

    STALE = 1
    CORDONED = 2
    GPU_CLASS = 3
    # What a node *is* (its card type, its labels) before what it has free: a node
    # whose labels do not match the selector never fits, free cards or not, and a
    # reason that said "no free GPU" of it sent operators after capacity (issue 24).
    LABELS = 4
    BACKOFF = 5
    FREE_GPUS = 6
    MEMORY = 7


@dataclass(frozen=True, slots=True)
class Misfit:
    """The first check a node fails for a profile.

    ``detail`` is the node's GPU class for ``GPU_CLASS`` ("" when it has no
    cards) and the missing ``key=value`` for ``LABELS``; otherwise "".
    """

    check: Check
    detail: str = ""


def gpu_class_matches(node_class: str | None, profile: PlacementProfile) -> bool:
    """A CPU profile needs no card, so any node matches it, GPU nodes included."""
    return profile.gpu_class is None or node_class == profile.gpu_class


def missing_label(labels: Mapping[str, str], selector: Mapping[str, str]) -> str | None:
    """The first selector label (by key) the node lacks or has another value for."""
    # Most nodes asked have every label (or the selector is empty): check that
    # in any order first, and pay for sorting the keys only to name a missing one.
    for key, value in selector.items():
        if labels.get(key) != value:
            break
    else:
        return None
    for key in sorted(selector):
        if labels.get(key) != selector[key]:
            return f"{key}={selector[key]}"
    return None


def gpus_fit(free_gpus: int, needed: int) -> bool:
    # A profile asking for no cards is not refused by a node whose cards are all
    # taken, or even over-reserved by work outside this control plane.
    return needed == 0 or free_gpus >= needed


def memory_fits(free_memory_gb: float | None, needed_gb: int) -> bool:
    # Unknown memory fits: see Node.
    return needed_gb <= 0 or free_memory_gb is None or free_memory_gb >= needed_gb


def selector_key(selector: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """A hashable, order-independent form of a node selector."""
    return tuple(sorted(selector.items()))


def misfit(
    node: Node,
    profile: PlacementProfile,
    *,
    fresh: bool,
    free_gpus: int,
    free_memory_gb: float | None,
    closed: bool = False,
    backing_off: bool = False,
) -> Misfit | None:
    """The first check ``node`` fails for ``profile`` given what is free on it, or None.

    ``closed``: cordoned or draining; ``backing_off``: the model's replicas
    failed there recently (``scheduler.lifecycle.inputs.BackoffPolicy``).
    """
    if not fresh:
        return Misfit(Check.STALE)
    if closed:
        return Misfit(Check.CORDONED)
    if not gpu_class_matches(node.gpu_class, profile):
        return Misfit(Check.GPU_CLASS, node.gpu_class or "")
    label = missing_label(node.labels, profile.node_selector)
    if label is not None:
        return Misfit(Check.LABELS, label)
    if backing_off:
        return Misfit(Check.BACKOFF)
    if not gpus_fit(free_gpus, profile.gpus_per_node):
        return Misfit(Check.FREE_GPUS)
    if not memory_fits(free_memory_gb, profile.min_memory_gb):
        return Misfit(Check.MEMORY)
    return None


def hardware_misfit(node: Node, profile: PlacementProfile) -> str | None:
    """Why a node that runs a replica can no longer be one of its nodes, or None.

    Only what the node *is* (card type, labels) is checked here; whether it
    still has room is a question of capacity, asked separately.
    """
    if not gpu_class_matches(node.gpu_class, profile):
        return f"gpu_class is {node.gpu_class or 'none'} not {profile.gpu_class}"
    label = missing_label(node.labels, profile.node_selector)
    if label is not None:
        return f"lacks label {label}"
    return None
