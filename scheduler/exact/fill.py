"""Cards a plan leaves idle, put to use by one node's swap at a time: a packing to compare with.

CP-SAT's ceiling is only as good as the program's relaxation: on openb with the trace's
own pods (7,064 one-replica models, 7,433 cards asked of 6,212) its proven bound stays
above the cluster's card count, so it says nothing about the cards the planner leaves
idle. The other way to settle "does any packing use them" is to *show* one: when a
packing places as many cards as the fresh nodes have, nothing can place more, and the
proof is the packing itself, checked by ``problems`` (which shares nothing with the
search but the planner's class and label matching; the unit tests hold both to a
brute force). Like the planner and ``program``, it counts cards and memory, not CPU.

The search is local and small, one node at a time (nodes by name): for a node with idle
cards, which of its own single-node replicas to keep and which unplaced replicas to add
so that the node carries the most cards (a two-dimensional knapsack, cards and memory,
over shapes of replica rather than replicas, solved exactly by CP-SAT on one worker).
The replicas it lets go return to the unplaced pool, so the round gains exactly what
the node gains; a swap is taken only if it gains a card. Passes repeat until one gains
nothing: each swap gains a card, so it ends.

What it does not do: gangs (they stay where they are and only take capacity), several
priority tiers (one card of a higher tier outranks any number below, which a swap that
counts cards would not respect: refused), spread (not counted).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.fit import gpu_class_matches, missing_label
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement

# OR-Tools (with the pandas and numpy it loads, ~0.5 s of CPU) is imported when a program
# is built, not with the module (as in scheduler.exact.bound).
if TYPE_CHECKING:
    pass

# A replica's shape on one node: cards, memory (GB).
Shape = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Swap:
    """One node's swap: the replicas let go (back to the pool) and those placed on it."""

    node: str
    out: tuple[Placement, ...]
    into: tuple[Placement, ...]

    @property
    def gained(self) -> int:
        return sum(p.gpus_per_node for p in self.into) - sum(p.gpus_per_node for p in self.out)


@dataclass(frozen=True, slots=True)
class Filled:
    placements: tuple[Placement, ...]
    swaps: tuple[Swap, ...]


def fresh_nodes(nodes: Sequence[Node], now: datetime, stale_after: timedelta) -> list[Node]:
    """The nodes a round may place on (as ``scheduler.exact.program``), by name."""
    return sorted((n for n in nodes if n.reported_at >= now - stale_after), key=lambda n: n.name)


def fill_idle(
    demands: Sequence[Demand],
    nodes: Sequence[Node],
    placements: Sequence[Placement],
    now: datetime,
    *,
    stale_after: timedelta = timedelta(seconds=90),
) -> Filled:
    """``placements`` with idle cards used by per-node swaps (see module)."""
    if len({d.priority for d in demands}) > 1:
        raise ValueError("fill_idle counts cards of one priority tier; these demands have several")
    by_model = {d.model: d for d in demands}
    on_node: dict[str, list[Placement]] = {}
    fixed_gpus: dict[str, int] = {}
    fixed_memory: dict[str, int] = {}
    for p in placements:
        if len(p.nodes) == 1 and p.model in by_model:
            on_node.setdefault(p.nodes[0], []).append(p)
            continue
        for name in p.nodes:
            fixed_gpus[name] = fixed_gpus.get(name, 0) + p.gpus_per_node
            fixed_memory[name] = fixed_memory.get(name, 0) + p.memory_gb_per_node
    taken: dict[str, set[int]] = {d.model: set() for d in demands}
    for p in placements:
        taken.setdefault(p.model, set()).add(p.replica)
    swaps: list[Swap] = []
    gained = True
    while gained:
        gained = False
        for node in fresh_nodes(nodes, now, stale_after):
            cards = max(node.gpus - node.gpus_reserved, 0) - fixed_gpus.get(node.name, 0)
            here = on_node.get(node.name, [])
            if cards - sum(p.gpus_per_node for p in here) <= 0:
                continue
            swap = _swap(
                node,
                cards=cards,
                fixed_memory=fixed_memory.get(node.name, 0),
                here=here,
                demands=demands,
                taken=taken,
            )
            if swap is None:
                continue
            swaps.append(swap)
            gained = True
            for p in swap.out:
                taken[p.model].discard(p.replica)
            for p in swap.into:
                taken[p.model].add(p.replica)
            gone = {(p.model, p.replica) for p in swap.out}
            on_node[node.name] = [p for p in here if (p.model, p.replica) not in gone]
            on_node[node.name] += swap.into
    single = [p for ps in on_node.values() for p in ps]
    rest = [p for p in placements if not (len(p.nodes) == 1 and p.model in by_model)]
    out = sorted((*single, *rest), key=lambda p: (p.model, p.replica))
    return Filled(tuple(out), tuple(swaps))


def _best_profile(node: Node, demand: Demand) -> PlacementProfile | None:
    """The demand's single-node profile that puts the most cards on ``node`` (then the least
    memory, then declaration order), if one fits the node empty."""
    fits = [
        p
        for p in demand.profiles
        if p.nodes <= 1
        and p.gpus_per_node > 0
        and gpu_class_matches(node.gpu_class, p)
        and missing_label(node.labels, p.node_selector) is None
        and p.gpus_per_node <= node.gpus - node.gpus_reserved
        and (node.memory_gb is None or p.min_memory_gb <= node.memory_gb)
    ]
    if not fits:
        return None
    return min(fits, key=lambda p: (-p.gpus_per_node, p.min_memory_gb))


def _swap(
    node: Node,
    *,
    cards: int,
    fixed_memory: int,
    here: list[Placement],
    demands: Sequence[Demand],
    taken: dict[str, set[int]],
) -> Swap | None:
    """The node's best swap, if it gains a card: a knapsack over shapes (see module)."""
    # Unplaced replicas that fit the node, per shape, in demand order (their lowest free slots).
    pool: dict[Shape, list[tuple[Demand, PlacementProfile]]] = {}
    for d in demands:
        free = max(d.replicas, 0) - len(taken.get(d.model, ()))
        if free <= 0:
            continue
        prof = _best_profile(node, d)
        if prof is None:
            continue
        pool.setdefault((prof.gpus_per_node, prof.min_memory_gb), []).extend([(d, prof)] * free)
    if not pool:
        return None
    mine: dict[Shape, list[Placement]] = {}
    for p in sorted(here, key=lambda p: (p.model, p.replica)):
        mine.setdefault((p.gpus_per_node, p.memory_gb_per_node), []).append(p)
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    keep = {s: model.new_int_var(0, len(ps), f"keep{s}") for s, ps in sorted(mine.items())}
    add = {
        s: model.new_int_var(0, min(len(ps), cards // max(s[0], 1)), f"add{s}")
        for s, ps in sorted(pool.items())
    }
    used = [(s, v) for s, v in (*keep.items(), *add.items())]
    model.add(sum(s[0] * v for s, v in used) <= cards)
    if node.memory_gb is not None:
        model.add(sum(s[1] * v for s, v in used) <= math.floor(node.memory_gb) - fixed_memory)
    # Cards on the node first; among equal cards, the fewest replicas let go or added.
    changes = sum(len(ps) - keep[s] for s, ps in mine.items()) + sum(add.values())
    weight = sum(len(ps) for ps in mine.values()) + cards + 1
    model.maximize(weight * sum(s[0] * v for s, v in used) - changes)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = 10.0
    solver.parameters.random_seed = 0
    if solver.solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    before = sum(p.gpus_per_node for p in here)
    after = sum(s[0] * solver.value(v) for s, v in used)
    if after <= before:
        return None
    out: list[Placement] = []
    for s, ps in mine.items():
        # Let go the last ones of the shape (by model, replica): any would do.
        out += ps[solver.value(keep[s]) :]
    into: list[Placement] = []
    slots = {d.model: set(taken.get(d.model, ())) for d in demands}
    for s, entries in pool.items():
        for d, prof in entries[: solver.value(add[s])]:
            replica = min(set(range(max(d.replicas, 0))) - slots[d.model])
            slots[d.model].add(replica)
            into.append(
                Placement(
                    model=d.model,
                    replica=replica,
                    profile=prof.name,
                    nodes=(node.name,),
                    gpus_per_node=prof.gpus_per_node,
                    gpu_class=prof.gpu_class,
                    memory_gb_per_node=prof.min_memory_gb,
                )
            )
    return Swap(node.name, tuple(out), tuple(into))


def problems(
    demands: Sequence[Demand],
    nodes: Sequence[Node],
    placements: Sequence[Placement],
    now: datetime,
    *,
    stale_after: timedelta = timedelta(seconds=90),
) -> list[str]:
    """Why ``placements`` is not a valid round on ``nodes`` (empty if it is).

    Checked from scratch, sharing nothing with the search that built it but the
    planner's class and label matching: each replica
    once, within its model's count, on one of its profiles as that profile asks, on fresh
    nodes of the profile's class and labels (a gang on distinct nodes of one fabric), and
    each node's cards and memory within what it has.
    """
    by_model = {d.model: d for d in demands}
    inventory = {n.name: n for n in fresh_nodes(nodes, now, stale_after)}
    out: list[str] = []
    seen: set[tuple[str, int]] = set()
    gpus: dict[str, int] = {}
    memory: dict[str, int] = {}
    for p in placements:
        where = f"{p.model}/{p.replica}"
        d = by_model.get(p.model)
        if d is None:
            out.append(f"{where}: no such model")
            continue
        if (p.model, p.replica) in seen:
            out.append(f"{where}: placed twice")
        seen.add((p.model, p.replica))
        if not 0 <= p.replica < d.replicas:
            out.append(f"{where}: beyond the {d.replicas} replicas wanted")
        prof = next((q for q in d.profiles if q.name == p.profile), None)
        if prof is None:
            out.append(f"{where}: no profile {p.profile}")
            continue
        if (p.gpus_per_node, p.gpu_class, p.memory_gb_per_node) != (
            prof.gpus_per_node,
            prof.gpu_class,
            prof.min_memory_gb,
        ):
            out.append(f"{where}: not what profile {p.profile} asks")
        if len(p.nodes) != max(prof.nodes, 1) or len(set(p.nodes)) != len(p.nodes):
            out.append(f"{where}: {len(p.nodes)} nodes for a {prof.nodes}-node profile")
        hosts = [inventory.get(name) for name in p.nodes]
        if any(h is None for h in hosts):
            out.append(f"{where}: on a node that is not fresh or not there")
            continue
        fabrics = {h.fabric for h in hosts if h is not None}
        if len(p.nodes) > 1 and (len(fabrics) != 1 or None in fabrics):
            out.append(f"{where}: a gang across fabrics")
        for h in hosts:
            assert h is not None
            if not gpu_class_matches(h.gpu_class, prof):
                out.append(f"{where}: {h.name} is {h.gpu_class}, not {prof.gpu_class}")
            if missing_label(h.labels, prof.node_selector) is not None:
                out.append(f"{where}: {h.name} lacks a selector label")
            gpus[h.name] = gpus.get(h.name, 0) + p.gpus_per_node
            memory[h.name] = memory.get(h.name, 0) + p.memory_gb_per_node
    for name, used in sorted(gpus.items()):
        n = inventory[name]
        if used > n.gpus - n.gpus_reserved:
            out.append(f"{name}: {used} cards used of {n.gpus - n.gpus_reserved}")
        if n.memory_gb is not None and memory[name] > n.memory_gb:
            out.append(f"{name}: {memory[name]} GB used of {n.memory_gb:g}")
    return out
