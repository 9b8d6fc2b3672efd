"""A placement round as an integer program, solved exactly (or bounded) by OR-Tools CP-SAT.

The inputs are the planner's: demands, inventory, current placements, ``now``. The
answer is the best set of placements CP-SAT finds within a deterministic work limit,
with its proven bound, so that a heuristic round can be divided by either
(``scheduler.exact.score`` counts both the same way).

The program, for each group of interchangeable demands (the same profiles and
priority; one demand per group when spread is counted):

- ``y[g, p, n]`` replicas of the group on node ``n`` with single-node profile ``p``;
- ``z[g, p, f]`` gang replicas of the group in fabric ``f`` with a ``k``-node profile,
  and ``u[g, p, n]`` how many of them use node ``n``: ``sum u = k z`` over the fabric
  and ``u <= z``, which is exactly "z sets of k distinct nodes" (a multiset with no
  element more than ``z`` times and ``k z`` elements splits into ``z`` such sets);
- ``keep[c]`` per current placement: kept where it is, or moved/dropped (a move);
- per node, cards and memory used (kept + new) within what the node has;
- per model, kept + new within its wanted replicas.

The objective is ``scheduler.exact.score``'s order (``Score.key``) as one weighted
sum: per priority tier, GPUs placed, then replicas placed (each tier's weight larger
than everything below it can add up to), then kept placements (moves against), then
replicas apart (sharing a node with their own model against). ``objective="replicas"``
drops the GPU terms (replicas per tier first); ``"gpus"`` counts cards placed only.

What it leaves out, each of which only makes the exact answer larger (so a heuristic
within x% of it is within x% of the true optimum too): required spread and
``spread_by`` domains, cordons, back-offs and rollouts (``Lifecycle`` is not an input).

Determinism: one worker, a fixed ``max_deterministic_time`` and seed, and a program
built in a fixed order (nodes by name, demands in the order given, current placements
by slot), so the same inputs give the same answer on any machine of the same build.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from catalog.definition.views import PlacementProfile
from scheduler.exact.score import Score, score, tiers
from scheduler.planner.fleet.fit import gpu_class_matches, missing_label, selector_key
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement

# OR-Tools (with the pandas and numpy it loads, ~0.5 s of CPU) is imported when a program
# is built, not with the module (as in scheduler.exact.bound).
if TYPE_CHECKING:
    from ortools.sat.python import cp_model

Objective = Literal["planner", "replicas", "gpus"]
DEFAULT_WORK = 10.0  # deterministic seconds: a unit of work, not of the clock
_MAX_WEIGHT = 1 << 60


@dataclass(frozen=True, slots=True)
class Answer:
    """What CP-SAT found: ``status`` ``optimal`` (best proven), ``feasible`` (the work
    limit stopped it; ``bound`` is then the proven ceiling) or ``unknown``.

    ``objective`` and ``bound`` are in the program's weighted units; ``score`` is the
    found placements counted by ``scheduler.exact.score`` (None when nothing was
    found); ``gpus_bound`` / ``replicas_bound`` the proven ceiling of the objective's
    first term decoded into GPUs (``planner`` and ``gpus``) or replicas (``replicas``),
    for a single priority tier (``gpus``: always), else None.
    """

    status: str
    objective: int
    bound: int
    score: Score | None
    placements: tuple[Placement, ...]
    replicas_bound: int | None
    gpus_bound: int | None
    variables: int
    wall_seconds: float
    deterministic_seconds: float


@dataclass(slots=True)
class _Group:
    demands: list[Demand]
    profiles: tuple[PlacementProfile, ...]
    priority: int
    wanted: int
    # (profile index, node) -> count variable, single-node profiles
    single: dict[tuple[int, str], cp_model.IntVar] = field(default_factory=dict)
    # (profile index, fabric) -> gang count, and (profile index, node) -> use of that node
    gangs: dict[tuple[int, str], cp_model.IntVar] = field(default_factory=dict)
    uses: dict[tuple[int, str], cp_model.IntVar] = field(default_factory=dict)


def solve(
    demands: Sequence[Demand],
    nodes: Sequence[Node],
    current: Sequence[Placement],
    now: datetime,
    *,
    stale_after: timedelta = timedelta(seconds=90),
    grace: timedelta = timedelta(minutes=5),
    work: float = DEFAULT_WORK,
    spread: bool = True,
    gpus: bool = False,
    objective: Objective = "planner",
    hint: Sequence[Placement] = (),
) -> Answer:
    """The best round CP-SAT finds within ``work`` deterministic seconds (see module).

    ``objective``: ``planner`` (``scheduler.exact.score.Score.key``: per tier GPUs, then
    replicas; then moves, then spread), ``replicas`` (``Score.replicas_key``) or ``gpus``
    (cards placed, nothing else; ``gpus=True`` is the same).
    ``hint``: placements to start from (a heuristic's plan), so that a work limit too
    short to find anything better still returns at least that; part of the inputs.
    """
    if now.tzinfo is None:
        raise ValueError(f"now {now} has no time zone; pass the current time in UTC")
    from ortools.sat.python import cp_model

    statuses = {
        cp_model.OPTIMAL: "optimal",
        cp_model.FEASIBLE: "feasible",
        cp_model.INFEASIBLE: "infeasible",
        cp_model.MODEL_INVALID: "invalid",
        cp_model.UNKNOWN: "unknown",
    }
    inventory = {n.name: n for n in sorted(nodes, key=lambda n: n.name)}
    fresh = sorted(name for name, n in inventory.items() if n.reported_at >= now - stale_after)
    alive = {name for name, n in inventory.items() if n.reported_at >= now - stale_after - grace}
    program = _Program(cp_model.CpModel(), inventory, _groups(demands, spread))
    program.keep_current(demands, current, alive)
    program.place_new(fresh)
    program.within_capacity()
    placed = program.placed_per_group()
    if gpus:
        objective = "gpus"
    weights = _Weights.of(demands, program.groups, len(program.keep), spread, objective)
    if objective == "gpus":
        program.model.maximize(program.gpus_placed())
    else:
        # Every term is kept non-negative (kept placements rather than moves, replicas
        # apart rather than together), so the proven bound divided by a term's weight
        # is a ceiling of that term: the terms below it add up to less than its weight.
        terms: list[cp_model.LinearExprT] = []
        for i, g in enumerate(program.groups):
            terms.append(weights.replicas[g.priority] * placed[i])
            if objective == "planner":
                terms.append(weights.gpus[g.priority] * program.group_gpus(i))
        terms += [weights.move * k for _, k in program.keep if not isinstance(k, int)]
        if spread:
            # At the optimum each e is its replicas beyond the first, at most total_wanted.
            terms.append(weights.total_wanted - cp_model.LinearExpr.sum(program.colocated()))
        program.model.maximize(cp_model.LinearExpr.sum(terms))
    _hint(program.model, program.groups, program.keep, hint, inventory)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = work
    solver.parameters.random_seed = 0
    status = solver.solve(program.model)
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    placements = _decode(solver, program.groups, program.keep, inventory) if found else ()
    bound = math.floor(solver.best_objective_bound + 1e-6)
    top = tiers(demands)[:1]
    replicas_bound = gpus_bound = None
    if objective == "gpus":
        gpus_bound = bound
    elif top and len(tiers(demands)) == 1:
        if objective == "planner":
            gpus_bound = max(bound, 0) // weights.gpus[top[0]]
        else:
            replicas_bound = max(bound, 0) // weights.replicas[top[0]]
    return Answer(
        status=statuses.get(status, str(status)),
        objective=round(solver.objective_value) if found else 0,
        bound=bound,
        score=score(demands, placements, current) if found else None,
        placements=placements,
        replicas_bound=replicas_bound,
        gpus_bound=gpus_bound,
        variables=len(program.model.proto.variables),
        wall_seconds=solver.wall_time,
        deterministic_seconds=solver.deterministic_time,
    )


@dataclass(frozen=True, slots=True)
class _Weights:
    """Each term's weight: more than everything below it can add up to (see module).

    From the bottom: replicas apart (1 each, up to ``total_wanted``), kept placements,
    then per tier from the lowest up its replicas, then (``planner``) per tier from the
    lowest up its GPUs.
    """

    total_wanted: int
    move: int
    replicas: dict[int, int]
    gpus: dict[int, int]

    @classmethod
    def of(
        cls,
        demands: Sequence[Demand],
        groups: Sequence[_Group],
        current: int,
        spread: bool,
        objective: Objective,
    ) -> _Weights:
        total_wanted = sum(g.wanted for g in groups)
        move = (total_wanted + 1) if spread else 1
        weight = move * (current + 1)
        replicas: dict[int, int] = {}
        order = list(reversed(tiers(demands)))
        for tier in order:
            replicas[tier] = weight
            weight *= sum(g.wanted for g in groups if g.priority == tier) + 1
        gpus: dict[int, int] = {}
        if objective == "planner":
            for tier in order:
                gpus[tier] = weight
                weight *= sum(g.wanted * _most_gpus(g) for g in groups if g.priority == tier) + 1
        if weight > _MAX_WEIGHT:
            raise ValueError(
                f"{len(order)} priority tiers of up to {total_wanted} replicas make "
                "objective weights too large for one program; solve fewer tiers at once"
            )
        return cls(total_wanted, move, replicas, gpus)


def _most_gpus(group: _Group) -> int:
    """The most cards one replica of the group can take (its largest profile)."""
    return max((p.gpus_per_node * max(p.nodes, 1) for p in group.profiles), default=0)


@dataclass(slots=True)
class _Program:
    """The program as it is built: variables per group, and what each node carries."""

    model: cp_model.CpModel
    inventory: dict[str, Node]
    groups: list[_Group]
    keep: list[tuple[Placement, cp_model.IntVar | int]] = field(default_factory=list)
    used_gpus: dict[str, list[cp_model.LinearExprT]] = field(default_factory=dict)
    used_memory: dict[str, list[cp_model.LinearExprT]] = field(default_factory=dict)

    def _use(self, name: str, gpus: int, memory: int, var: cp_model.IntVar) -> None:
        self.used_gpus.setdefault(name, []).append(gpus * var)
        self.used_memory.setdefault(name, []).append(memory * var)

    def keep_current(
        self, demands: Sequence[Demand], current: Sequence[Placement], alive: set[str]
    ) -> None:
        """Current placements: keepable (a variable) if the model still wants the slot and
        the profile, and the nodes live; otherwise a forced move (0)."""
        by_model = {d.model: d for d in demands}
        for c in sorted(current, key=lambda p: (p.model, p.replica, p.nodes)):
            demand = by_model.get(c.model)
            ok = (
                demand is not None
                and demand.replicas > c.replica
                and any(p.name == c.profile for p in demand.profiles)
                and all(n in alive for n in c.nodes)
            )
            if not ok:
                self.keep.append((c, 0))
                continue
            k = self.model.new_bool_var(f"keep[{c.model}/{c.replica}]")
            self.keep.append((c, k))
            for name in c.nodes:
                self._use(name, c.gpus_per_node, c.memory_gb_per_node, k)

    def place_new(self, fresh: Sequence[str]) -> None:
        """The count variables of new replicas, per group, profile and node (or fabric)."""
        by_fabric: dict[str, list[str]] = {}
        for name in fresh:
            fabric = self.inventory[name].fabric
            if fabric is not None:
                by_fabric.setdefault(fabric, []).append(name)
        for gi, g in enumerate(self.groups):
            if g.wanted <= 0:
                continue
            for pi, prof in enumerate(g.profiles):
                fits = [n for n in fresh if _fits_empty(self.inventory[n], prof)]
                if prof.nodes <= 1:
                    for name in fits:
                        cap = _most(self.inventory[name], prof, g.wanted)
                        if cap > 0:
                            var = self.model.new_int_var(0, cap, f"y[{gi},{pi},{name}]")
                            g.single[(pi, name)] = var
                            self._use(name, prof.gpus_per_node, prof.min_memory_gb, var)
                    continue
                fitting = set(fits)
                for fabric, all_members in sorted(by_fabric.items()):
                    members = [m for m in all_members if m in fitting]
                    if len(members) >= prof.nodes:
                        self._gang(gi, pi, fabric, members)

    def _gang(self, gi: int, pi: int, fabric: str, members: list[str]) -> None:
        g = self.groups[gi]
        prof = g.profiles[pi]
        room = {m: _most(self.inventory[m], prof, g.wanted) for m in members}
        most = min(g.wanted, sum(room.values()) // prof.nodes)
        if most <= 0:
            return
        z = self.model.new_int_var(0, most, f"z[{gi},{pi},{fabric}]")
        g.gangs[(pi, fabric)] = z
        uses = []
        for m in members:
            u = self.model.new_int_var(0, min(most, room[m]), f"u[{gi},{pi},{m}]")
            self.model.add(u <= z)
            g.uses[(pi, m)] = u
            uses.append(u)
            self._use(m, prof.gpus_per_node, prof.min_memory_gb, u)
        self.model.add(sum(uses) == prof.nodes * z)

    def within_capacity(self) -> None:
        for name, node in self.inventory.items():
            if self.used_gpus.get(name):
                self.model.add(sum(self.used_gpus[name]) <= max(node.gpus - node.gpus_reserved, 0))
            if self.used_memory.get(name) and node.memory_gb is not None:
                self.model.add(sum(self.used_memory[name]) <= math.floor(node.memory_gb))

    def placed_per_group(self) -> list[cp_model.LinearExprT]:
        """Kept + new per group, within what its models want (each model's kept too)."""
        kept_of: dict[str, list[cp_model.IntVar]] = {}
        for c, k in self.keep:
            if not isinstance(k, int):
                kept_of.setdefault(c.model, []).append(k)
        placed: list[cp_model.LinearExprT] = []
        for g in self.groups:
            kept = [k for d in g.demands for k in kept_of.get(d.model, [])]
            for d in g.demands:
                if len(kept_of.get(d.model, [])) > max(d.replicas, 0):
                    self.model.add(sum(kept_of[d.model]) <= max(d.replicas, 0))
            total = sum(g.single.values()) + sum(g.gangs.values()) + sum(kept)
            self.model.add(total <= g.wanted)
            placed.append(total)
        return placed

    def group_gpus(self, gi: int) -> cp_model.LinearExprT:
        """Cards placed by one group: its new replicas and its models' kept ones."""
        g = self.groups[gi]
        models = {d.model for d in g.demands}
        new = [
            g.profiles[pi].gpus_per_node * g.profiles[pi].nodes * var
            for (pi, _), var in (*g.single.items(), *g.gangs.items())
        ]
        kept = [
            c.gpus_per_node * len(c.nodes) * k
            for c, k in self.keep
            if c.model in models and not isinstance(k, int)
        ]
        return sum(new) + sum(kept)

    def gpus_placed(self) -> cp_model.LinearExprT:
        new = [
            g.profiles[pi].gpus_per_node * g.profiles[pi].nodes * var
            for g in self.groups
            for (pi, _), var in (*g.single.items(), *g.gangs.items())
        ]
        kept = [c.gpus_per_node * len(c.nodes) * k for c, k in self.keep]
        return sum(new) + sum(kept)

    def colocated(self) -> list[cp_model.IntVar]:
        """Per group of one model and node: its replicas there beyond the first."""
        out: list[cp_model.IntVar] = []
        for gi, g in enumerate(self.groups):
            if g.wanted < 2:
                continue
            on_node: dict[str, list[cp_model.LinearExprT]] = {}
            for (_, name), var in (*g.single.items(), *g.uses.items()):
                on_node.setdefault(name, []).append(var)
            for c, k in self.keep:
                if c.model == g.demands[0].model and not isinstance(k, int):
                    for name in c.nodes:
                        on_node.setdefault(name, []).append(k)
            for name, terms in sorted(on_node.items()):
                e = self.model.new_int_var(0, g.wanted, f"e[{gi},{name}]")
                self.model.add(e >= sum(terms) - 1)
                out.append(e)
        return out


def _hint(
    model: cp_model.CpModel,
    groups: Sequence[_Group],
    keep: Sequence[tuple[Placement, cp_model.IntVar | int]],
    hint: Sequence[Placement],
    inventory: dict[str, Node],
) -> None:
    """Hint every variable with the count ``hint`` gives it (0 where it says nothing)."""
    if not hint:
        return
    given = {(p.model, p.replica, p.nodes, p.profile) for p in hint}
    for c, k in keep:
        if not isinstance(k, int):
            model.add_hint(k, (c.model, c.replica, c.nodes, c.profile) in given)
    kept = {(c.model, c.replica, c.nodes, c.profile) for c, _ in keep}
    group_of = {d.model: gi for gi, g in enumerate(groups) for d in g.demands}
    counts: dict[tuple[int, str, str], int] = {}
    for p in hint:
        gi = group_of.get(p.model)
        if gi is None or (p.model, p.replica, p.nodes, p.profile) in kept:
            continue
        for name in p.nodes:
            counts[(gi, p.profile, name)] = counts.get((gi, p.profile, name), 0) + 1
    for gi, g in enumerate(groups):
        for (pi, name), var in g.single.items():
            model.add_hint(var, counts.get((gi, g.profiles[pi].name, name), 0))
        for (pi, name), var in g.uses.items():
            model.add_hint(var, counts.get((gi, g.profiles[pi].name, name), 0))
        for (pi, fabric), var in g.gangs.items():
            uses = sum(
                counts.get((gi, g.profiles[pi].name, n), 0)
                for (upi, n) in g.uses
                if upi == pi and inventory[n].fabric == fabric
            )
            model.add_hint(var, uses // g.profiles[pi].nodes)


def _groups(demands: Sequence[Demand], spread: bool) -> list[_Group]:
    """Interchangeable demands as one group (first-seen order): fewer variables, same optimum.

    Demands merge when their profiles and priority are equal and spread does not tell
    them apart (spread off, or one replica each)."""
    groups: list[_Group] = []
    index: dict[tuple[object, ...], _Group] = {}
    for d in demands:
        wanted = max(d.replicas, 0)
        if spread and wanted > 1:
            groups.append(_Group([d], d.profiles, d.priority, wanted))
            continue
        key = (tuple(_shape(p) for p in d.profiles), d.priority)
        if key in index:
            index[key].demands.append(d)
            index[key].wanted += wanted
        else:
            index[key] = _Group([d], d.profiles, d.priority, wanted)
            groups.append(index[key])
    return groups


def _shape(prof: PlacementProfile) -> tuple[object, ...]:
    """What placing with a profile depends on (its name too: it is what a placement records)."""
    return (
        prof.name,
        prof.gpu_class,
        prof.gpus_per_node,
        prof.nodes,
        prof.priority,
        selector_key(prof.node_selector),
        prof.min_memory_gb,
    )


def _fits_empty(node: Node, prof: PlacementProfile) -> bool:
    """Whether the node, with nothing placed on it, could host one replica of ``prof``."""
    if not gpu_class_matches(node.gpu_class, prof):
        return False
    if missing_label(node.labels, prof.node_selector) is not None:
        return False
    if prof.gpus_per_node > node.gpus - node.gpus_reserved:
        return False
    return not (
        prof.min_memory_gb > 0
        and node.memory_gb is not None
        and prof.min_memory_gb > node.memory_gb
    )


def _most(node: Node, prof: PlacementProfile, wanted: int) -> int:
    """How many replicas of ``prof`` an empty node could hold, at most ``wanted``."""
    most = wanted
    if prof.gpus_per_node > 0:
        most = min(most, (node.gpus - node.gpus_reserved) // prof.gpus_per_node)
    if prof.min_memory_gb > 0 and node.memory_gb is not None:
        most = min(most, math.floor(node.memory_gb) // prof.min_memory_gb)
    return most


def _decode(
    solver: cp_model.CpSolver,
    groups: Sequence[_Group],
    keep: Sequence[tuple[Placement, cp_model.IntVar | int]],
    inventory: dict[str, Node],
) -> tuple[Placement, ...]:
    """The solution as placements: kept ones in their slots, new ones in the lowest free."""
    out: list[Placement] = []
    taken: dict[str, set[int]] = {}
    for c, k in keep:
        if not isinstance(k, int) and solver.value(k):
            out.append(c)
            taken.setdefault(c.model, set()).add(c.replica)
    for g in groups:
        new: list[tuple[PlacementProfile, tuple[str, ...]]] = []
        for (pi, name), var in sorted(g.single.items(), key=lambda kv: kv[0]):
            new.extend([(g.profiles[pi], (name,))] * solver.value(var))
        for (pi, fabric), z in sorted(g.gangs.items(), key=lambda kv: kv[0]):
            count = solver.value(z)
            left = {
                name: solver.value(u)
                for (upi, name), u in g.uses.items()
                if upi == pi and inventory[name].fabric == fabric
            }
            for _ in range(count):
                # The k nodes with the most uses left: always possible (see module).
                chosen = sorted(left, key=lambda n: (-left[n], n))[: g.profiles[pi].nodes]
                for name in chosen:
                    left[name] -= 1
                new.append((g.profiles[pi], tuple(sorted(chosen))))
        slots = (
            (d.model, r)
            for d in g.demands
            for r in range(max(d.replicas, 0))
            if r not in taken.get(d.model, set())
        )
        for (prof, names), (model_name, replica) in zip(new, slots, strict=False):
            out.append(
                Placement(
                    model=model_name,
                    replica=replica,
                    profile=prof.name,
                    nodes=names,
                    gpus_per_node=prof.gpus_per_node,
                    gpu_class=prof.gpu_class,
                    memory_gb_per_node=prof.min_memory_gb,
                )
            )
    return tuple(sorted(out, key=lambda p: (p.model, p.replica)))
