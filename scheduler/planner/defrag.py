"""Defragmentation: the fewest moves of other replicas that make room for an unplaced one.

Spread puts a model's replicas on distinct nodes, which is what fragments a cluster: 56
one-card replicas on 8 nodes of 8 cards leave one free card per node, and an 8-card
replica fits nowhere although 8 cards are free. Preemption cannot help (equal
priority), and nothing else moves a running replica.

``moves_for`` answers, for one unplaced replica: on which node (for a gang of
``profile.nodes``, on which nodes of one fabric), by moving which replicas where, it
would fit, with the fewest moves in total. A replica may be moved only
if its model's priority is equal or lower, its model allows moves (``movable``), and
the moves of its model stay within its disruption budget (``budget``: how many of its
replicas may be in motion at once). Each moved replica must itself fit somewhere else
(right class, labels, memory, free cards once earlier moves are counted), never on the
node being cleared (for a gang, on none of its nodes; the room, memory and budget the
moves for one of its nodes took are counted for the next). Among nodes (node sets), the
fewest moves win, then the fewest GPUs moved, then the node names: the answer is a
function of the inputs alone. Only single-node replicas are moved.

Pure: it reads a ``Capacity`` copy and the placements, and changes neither. It says
what to move; executing a move surge-first (the new copy ready before the old stops)
is the rollout machinery's (``scheduler.planner.rollout``: a placement carrying
``moving`` is held like an old replica until its model has all its wanted replicas
ready without it).

``defragment`` is the round's step (``plan.plan`` calls it after placing and
preempting): one defragmentation, or one spread repair, at a time in the cluster;
while a move is under way no other is planned, so each is a surge of a few
replicas whose effect the next rounds can see.

Cost: O(N x k log k) for N nodes of the profile's class and k replicas per node, plus
O(m x L log N) per candidate move (best-fit search for its destination). Within a
round's step that is paid once per shape and priority (``_Search``) and each node's
trial once (``_Index.cleared``): a further model searching the same shape costs only
the nodes running its own replicas, so the many models a large fleet leaves unplaced
no longer make the step O(N) each. A gang of g
nodes adds a sort of each fabric's nodes (O(N log N) in all) and, per fabric tried,
at most ``_RETRIES`` trials of g nodes; fabrics are tried by their lower bound and the
search stops at the first that cannot beat the best, so most fabrics cost only their
bound. Worst case (every fabric tried, none cleared): O(F x _RETRIES x g x m) moves
tried for F fabrics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import count, islice

from catalog.definition.views import PlacementProfile
from scheduler.lifecycle.inputs import Lifecycle, ModelLifecycle
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.planner.fleet.capacity import Capacity
from scheduler.planner.fleet.fit import gpus_fit, memory_fits, selector_key
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Move, Placement, changed_from, same_objects
from scheduler.planner.order import placement_order

# node -> its spread domain for a model (the node itself, or its spread_by label's value).
Domain = Callable[[str, str], str]


@dataclass(frozen=True, slots=True)
class Defrag:
    """Moves that make room on ``node`` for ``model`` with ``profile``; or why none do."""

    model: str
    profile: str
    node: str | None
    moves: tuple[Move, ...]
    refusal: str = ""
    # Models whose disruption budget (or movable: false) kept a replica in place.
    blocked: tuple[str, ...] = ()
    # Every node made room on, by name: ``(node,)``, or a gang's ``profile.nodes`` nodes
    # (``node`` is then the first of them).
    nodes: tuple[str, ...] = ()


def moves_for(
    model: str,
    priority: int,
    profile: PlacementProfile,
    capacity: Capacity,
    placements: Sequence[Placement],
    *,
    priorities: Mapping[str, int],
    budget: Mapping[str, int],
    profiles: Mapping[tuple[str, str], PlacementProfile],
    movable: Mapping[str, bool] | None = None,
    why: Mapping[str, str] | None = None,
    domain: Domain | None = None,
    required: Collection[str] = (),
    avoid: Collection[str] = (),
    index: _Index | None = None,
) -> Defrag:
    """The fewest moves that make room for one replica of ``model`` (see module).

    ``profiles``: (model, profile name) -> the profile a running replica was placed
    with, whose class, labels and memory its destination must meet. ``budget``: per
    model, how many of its replicas may be in motion at once; absent, no limit:
    a move is surge-first, so it never takes a model below the replicas it has ready.
    ``why``: per model, what its budget is, for the refusal. ``domain``: a model's
    spread domain of a node. A model in ``required`` (``spread_required``) is never
    moved to a domain that would then hold more of its replicas than the one it leaves
    held; any other model's replica goes to a node without one of its model's
    replicas where one of the best-fitting few is, else to the best-fitting node."""
    if index is None:
        index = _Index(placements, domain or _by_node, required)
    on_node = index.on_node
    blocked: set[str] = set()
    mobile = movable or {}
    if profile.nodes > 1:
        return _gang(
            model, priority, profile, capacity, index,
            priorities=priorities, budget=budget, profiles=profiles, movable=mobile,
            why=why or {}, avoid=avoid, blocked=blocked,
        )  # fmt: skip
    # Every node is searched once a round for each shape and priority (``_Search``), as
    # if for a model running nowhere: a model's own replicas are never its candidates,
    # so only the nodes running one of them are searched again for it. The answer is the
    # least (moves, GPUs moved, name) of the nodes that can be cleared, whatever order
    # they are tried in (each trial starts from nothing), so the nodes searched for
    # nobody in particular give it for every model that runs none of its replicas there.
    search = _Search.of(
        _Ask(profile, priority, capacity, index, priorities, mobile, budget, profiles)
    )
    mine = index.hosts.get(model, frozenset()) & search.eligible
    best: tuple[tuple[int, int, str], tuple[Move, ...]] | None = None
    for key, pairs in search.cleared:
        if key[2] not in mine and key[2] not in avoid:
            reason = f"to make room for model {model}, profile {profile.name} on node {key[2]}"
            best = (key, tuple(Move(victim, to, reason) for victim, to in pairs))
            break
    for name in sorted(mine):
        if name in avoid:
            continue
        bound = _candidates(
            name, model, priority, profile, capacity, on_node.get(name, []),
            priorities=priorities, movable=mobile, blocked=blocked,
        )  # fmt: skip
        if bound is None:
            continue
        found = _clear_alone(
            name, model, profile, capacity, index, bound[1],
            budget=budget, blocked=blocked, profiles=profiles, most=None,
        )  # fmt: skip
        if found is None:
            continue
        key = (len(found), sum(m.placement.gpus_per_node for m in found), name)
        if best is None or key < best[0]:
            best = (key, found)
    if best is None:
        # What stood in the way on the other nodes: every search of them found nothing.
        skipped = mine | (search.eligible & frozenset(avoid))
        blocked.update(search.blocked_without(skipped))
    if best is None:
        text = "no node can be cleared by moving replicas of equal or lower priority"
        return _refused(model, profile, text, blocked, why or {})
    return Defrag(model, profile.name, best[0][2], best[1], nodes=(best[0][2],))


def _clear_alone(  # noqa: PLR0917
    name: str,
    model: str,
    profile: PlacementProfile,
    capacity: Capacity,
    index: _Index,
    candidates: list[Placement],
    *,
    budget: Mapping[str, int],
    blocked: set[str],
    profiles: Mapping[tuple[str, str], PlacementProfile],
    most: int | None,
) -> tuple[Move, ...] | None:
    """``_clear`` of one node on its own, remembered for the round (``_Index.cleared``).

    A single node's trial starts from nothing (its own ``_Trial``, the spread counts
    restored after each), so its outcome depends only on the node, the replica's cards
    and memory and the candidates, never on the model it is for (save the moves'
    reason) or on the trials before it: the models left unplaced by a round, each
    searching the same nodes, clear each of them once rather than once a model.

    Remembered without ``most``: a node cleared in L moves is given up under ``most``
    exactly when L > ``most`` (``_clear`` stops at the first fit, before counting
    against ``most``), and one that cannot be cleared cannot under ``most`` either. The
    budgets that stood in the way are remembered too, for the refusal."""
    moves, stood_in_the_way, _ = _trial(
        name, model, profile, capacity, index, candidates, budget=budget, profiles=profiles
    )
    blocked.update(stood_in_the_way)
    if moves is None or (most is not None and len(moves) > most):
        return None
    reason = f"to make room for model {model}, profile {profile.name} on node {name}"
    return tuple(Move(victim, to, reason) for victim, to in moves)


def _trial(  # noqa: PLR0917
    name: str,
    model: str,
    profile: PlacementProfile,
    capacity: Capacity,
    index: _Index,
    candidates: list[Placement],
    *,
    budget: Mapping[str, int],
    profiles: Mapping[tuple[str, str], PlacementProfile],
) -> _Cleared:
    """A single node's trial (``_clear_alone``): made, or the round's or the round before's
    taken again (``_still_holds``)."""
    key = (name, profile.gpus_per_node, profile.min_memory_gb, *map(id, candidates))
    known = index.cleared.get(key)
    before = None if known is not None else index.cleared_before.get(key)
    if before is not None and _still_holds(before[2], name, candidates, capacity, index, budget):
        known = index.cleared[key] = before
        index.reused += 1
    if known is None:
        doomed = _doomed(name, profile, capacity, index, candidates, budget, profiles)
        if doomed is not None:
            known = index.cleared[key] = (
                None,
                doomed[0],
                _Read(
                    tuple(candidates),
                    (capacity.free_gpus(name), capacity.free_memory(name)),
                    tuple(budget.get(p.model) for p in candidates),
                    doomed[1],
                ),
            )
            index.doomed += 1
    if known is None:
        trial = _Trial(frozenset((name,)))
        stood: set[str] = set()
        try:
            found = _clear(
                name,
                model,
                profile,
                capacity,
                candidates=candidates,
                budget=budget,
                blocked_by_budget=stood,
                profiles=profiles,
                spread=index.spread,
                most=None,
                near=index.near,
                trial=trial,
            )
        finally:
            # The spread counts are shared between the nodes tried: undo this node's trial.
            trial.undo(index.spread)
        known = index.cleared[key] = (
            None if found is None else tuple((m.placement, m.to) for m in found),
            _frozen(stood),
            _Read(
                tuple(candidates),
                (capacity.free_gpus(name), capacity.free_memory(name)),
                tuple(budget.get(p.model) for p in candidates),
                tuple(trial.read),
            ),
        )
    return known


def _doomed(  # noqa: PLR0917
    name: str,
    profile: PlacementProfile,
    capacity: Capacity,
    index: _Index,
    candidates: Sequence[Placement],
    budget: Mapping[str, int],
    profiles: Mapping[tuple[str, str], PlacementProfile],
) -> tuple[frozenset[str], tuple[PlacementProfile, ...]] | None:
    """What ``_clear`` of ``name`` would find, without trying a move, when it cannot
    clear it: the models whose budget stood in the way and the victim profiles whose
    destinations it would have looked at, in order; None when it might clear it, or when
    what it finds depends on the moves it makes (then the trial is made).

    A move lands only on one of its victim profile's best-fitting nodes (``_near``), so
    the cards a trial can free are the node's own plus those of the candidates whose
    profile has some; fewer than the replica needs, and the trial fails having walked
    every candidate. What it says of them is then known: a candidate is blocked when its
    model's budget is spent, and only a move spends one, so a model with no room to move
    to (no move) and a budget is blocked exactly when that budget is 0. A model with both
    a budget and room to move to may be blocked after one of its moves, which only the
    trial says. A fleet whose unplaced shapes fit nowhere fails nearly every trial so
    (at 100,000 nodes, a lost node's first search of an 8-card shape: 20,000 trials)."""
    gpus = capacity.free_gpus(name)
    need = profile.gpus_per_node
    if gpus_fit(gpus, need):
        return None  # room in cards already: the trial says whether memory is
    stood: set[str] = set()
    read: list[PlacementProfile] = []
    near = index.near
    for victim in candidates:
        limit = budget.get(victim.model)
        if limit is not None and limit <= 0:
            stood.add(victim.model)
            continue
        own = profiles.get((victim.model, victim.profile))
        if own is None:
            continue
        if not any(seen is own for seen in read):
            read.append(own)
        if _near(own, capacity, near)[0]:
            if limit is not None:
                return None
            gpus += victim.gpus_per_node
    if gpus_fit(gpus, need):
        return None
    return _frozen(stood), tuple(read)


# Nothing stood in the way: one object for every trial and node that says so (a search
# of 35,000 nodes made as many empty sets, each alive until the next round's, and walked
# by the collector at the end of the round).
_NOTHING: frozenset[str] = frozenset()


def _frozen(stood: set[str]) -> frozenset[str]:
    return frozenset(stood) if stood else _NOTHING


@dataclass(frozen=True, slots=True)
class _Read:
    """What one node's trial read beyond its key, to tell whether a later round's trial of
    the same node would find the same (``IndexMemo``): its candidates (by identity: the key
    holds only their ids), the node's free cards and memory, the candidates' budgets, and
    the victim profiles whose best-fitting destinations (``near``) it looked at."""

    candidates: tuple[Placement, ...]
    free: tuple[int, float | None]
    budgets: tuple[int | None, ...]
    near: tuple[PlacementProfile, ...]


# A node's trial: its moves as (victim, destination), None if it cannot be cleared; the
# models whose budgets stood in the way; what it read.
_Cleared = tuple[tuple[tuple[Placement, str], ...] | None, frozenset[str], _Read]


def _still_holds(  # noqa: PLR0917
    read: _Read,
    name: str,
    candidates: Sequence[Placement],
    capacity: Capacity,
    index: _Index,
    budget: Mapping[str, int],
) -> bool:
    """Whether the round before's trial of ``name`` is this round's: everything ``_clear``
    reads is the same. The profiles and the spread's domains are (``IndexMemo`` patches an
    index only for the same demands and inventory); the spread counts are but for the
    models of the placements taken out (``_Index.changed``); the node's own room and the
    budgets are compared; and each destination list it looked at is the same nodes with
    the same room (``_Index.near_holds``), which is all ``_destination`` reads of capacity."""
    # Compared in C: the same objects compare equal at once (the key holds their ids).
    if read.candidates != tuple(candidates):
        return False
    if read.free != (capacity.free_gpus(name), capacity.free_memory(name)):
        return False
    changed = index.changed
    for p, limit in zip(candidates, read.budgets, strict=True):
        if p.model in changed or budget.get(p.model) != limit:
            return False
    return all(index.near_holds(profile, capacity) for profile in read.near)


def _refused(
    model: str, profile: PlacementProfile, text: str, blocked: set[str], why: Mapping[str, str]
) -> Defrag:
    if blocked:
        named = ", ".join(f"{m} ({why[m]})" if m in why else m for m in sorted(blocked))
        text += f"; the disruption budget of {named} stood in the way"
    return Defrag(model, profile.name, None, (), text, tuple(sorted(blocked)))


# How many node sets one fabric is tried with: each retry drops the node that could not
# be cleared (its moves found no destination, or a budget ran out) for the next one.
_RETRIES = 4


def _gang(
    model: str,
    priority: int,
    profile: PlacementProfile,
    capacity: Capacity,
    index: _Index,
    *,
    priorities: Mapping[str, int],
    budget: Mapping[str, int],
    profiles: Mapping[tuple[str, str], PlacementProfile],
    movable: Mapping[str, bool],
    why: Mapping[str, str],
    avoid: Collection[str],
    blocked: set[str],
) -> Defrag:
    """``moves_for`` a gang: ``profile.nodes`` nodes of one fabric (as the packer's
    ``best_gang``/``choose_gang``: eligible by class and labels, a node without a fabric
    never in a gang), cleared together by the fewest moves in total.

    Per fabric, its nodes are ranked by their own fewest moves (``_candidates``) and the
    first ``profile.nodes`` are cleared in one trial: no move lands on any of them, and
    the cards, memory and budget the earlier nodes' moves took are counted for the later
    ones. A node that cannot be cleared is replaced by the next (``_RETRIES`` times).
    Fabrics are tried by the sum of their nodes' bounds, stopping once none left can need
    as few moves as the best found; ties go to the fewest GPUs moved, then the node names."""
    size = profile.nodes
    by_fabric: dict[str, list[tuple[int, str, list[Placement]]]] = {}
    for name in capacity.eligible_names(profile):
        fabric = capacity.node(name).fabric
        if fabric is None or name in avoid:
            continue
        bound = _candidates(
            name, model, priority, profile, capacity, index.on_node.get(name, []),
            priorities=priorities, movable=movable, blocked=blocked,
        )  # fmt: skip
        if bound is not None:
            by_fabric.setdefault(fabric, []).append((bound[0], name, bound[1]))
    groups = []
    for fabric, entries in by_fabric.items():
        if len(entries) >= size:
            entries.sort(key=lambda t: (t[0], t[1]))
            groups.append((sum(t[0] for t in entries[:size]), fabric, entries))
    groups.sort(key=lambda g: (g[0], g[1]))
    best: tuple[tuple[int, int, tuple[str, ...]], tuple[Move, ...]] | None = None
    for least, _, entries in groups:
        if best is not None and least > best[0][0]:
            break
        found = _clear_gang(
            entries, size, model, profile, capacity, index,
            budget=budget, blocked=blocked, profiles=profiles,
            most=None if best is None else best[0][0],
        )  # fmt: skip
        if found is None:
            continue
        nodes, moves = found
        key = (len(moves), sum(m.placement.gpus_per_node for m in moves), nodes)
        if best is None or key < best[0]:
            best = (key, moves)
    if best is None:
        text = (
            f"no {size} nodes of one fabric can be cleared by moving replicas of equal or "
            "lower priority"
        )
        return _refused(model, profile, text, blocked, why)
    nodes = best[0][2]
    return Defrag(model, profile.name, nodes[0], best[1], nodes=nodes)


def _clear_gang(  # noqa: PLR0917
    entries: list[tuple[int, str, list[Placement]]],
    size: int,
    model: str,
    profile: PlacementProfile,
    capacity: Capacity,
    index: _Index,
    *,
    budget: Mapping[str, int],
    blocked: set[str],
    profiles: Mapping[tuple[str, str], PlacementProfile],
    most: int | None,
) -> tuple[tuple[str, ...], tuple[Move, ...]] | None:
    """``size`` of one fabric's ``entries`` (ranked: bound, name) cleared together, or None;
    ``most`` as for ``_clear``, for the moves of all of them."""
    pool = list(entries)
    for _ in range(_RETRIES):
        if len(pool) < size:
            return None
        chosen = pool[:size]
        if most is not None and sum(e[0] for e in chosen) > most:
            return None
        trial = _Trial(frozenset(e[1] for e in chosen))
        moves: list[Move] = []
        failed = None
        try:
            for entry in chosen:
                found = _clear(
                    entry[1],
                    model,
                    profile,
                    capacity,
                    candidates=entry[2],
                    budget=budget,
                    blocked_by_budget=blocked,
                    profiles=profiles,
                    spread=index.spread,
                    most=None if most is None else most - len(moves),
                    near=index.near,
                    trial=trial,
                )
                if found is None:
                    failed = entry
                    break
                moves.extend(found)
        finally:
            trial.undo(index.spread)
        if failed is None:
            return tuple(sorted(trial.cleared)), tuple(moves)
        pool.remove(failed)
    return None


class _Index:
    """The placements by node and the spread counts, built once a round: O(C)."""

    def __init__(
        self, placements: Sequence[Placement], domain: Domain, required: Collection[str]
    ) -> None:
        self.on_node: dict[str, list[Placement]] = {}
        for p in placements:
            if len(p.nodes) == 1:
                self.on_node.setdefault(p.nodes[0], []).append(p)
        # In ``_candidates``' order once a round, rather than sorted again per search:
        # a stable sort, filtered, is the filtered list sorted.
        for here in self.on_node.values():
            here.sort(key=_largest_first)
        self.spread = _Spread(placements, domain, required)
        # id(profile) -> its best-fitting nodes (``_destination``); the profiles are the
        # round's demands', alive as long as this index.
        self.near: Near = {}
        # The round before's trials and destinations (``IndexMemo``), each trial taken
        # again when what it read is the same (``_still_holds``); the models whose spread
        # counts changed since; and, per profile, whether its destinations are the same.
        self.cleared_before: dict[tuple[object, ...], _Cleared] = {}
        self.near_before: Near = {}
        self.changed: frozenset[str] = frozenset()
        self.near_same: dict[int, bool] = {}
        # How many trials were the round before's (for the tests), and how many were
        # known to fail without being made (``_doomed``).
        self.reused = 0
        self.doomed = 0
        # model -> the nodes running one of its single-node replicas.
        self.hosts: dict[str, frozenset[str]] = {}
        hosts: dict[str, set[str]] = {}
        for name, here in self.on_node.items():
            for p in here:
                hosts.setdefault(p.model, set()).add(name)
        self.hosts = {model: frozenset(names) for model, names in hosts.items()}
        # (class, labels, cards, memory, priority) -> every eligible node searched (``_Search``).
        self.searches: dict[tuple[object, ...], _Search] = {}
        # The round before's searches (``IndexMemo``), each patched at the nodes whose
        # inputs changed instead of searched again (``_Search.patched``); the nodes whose
        # list of placements changed since; every node's free room as the searches of
        # this round read it (taken at the first, ``room``).
        self.searches_before: dict[tuple[object, ...], _Search] = {}
        self.touched: frozenset[str] = frozenset()
        self.room: tuple[dict[str, int], dict[str, float | None]] | None = None
        self.moved: dict[int, frozenset[str]] = {}
        # How many searches were the round before's patched, and how many nodes of them
        # were searched again (for the tests and benchmarks).
        self.searches_patched = 0
        self.searched_again = 0
        # (node, cards, memory, candidates by identity) -> a single node's trial
        # (``_clear_alone``). Like ``near``, it holds for one capacity and one set of
        # budgets: an index serves the searches of one round's step, before any move.
        self.cleared: dict[tuple[object, ...], _Cleared] = {}

    def room_of(self, capacity: Capacity) -> tuple[dict[str, int], dict[str, float | None]]:
        """Every node's free room as this round's searches read it: taken once (the
        capacity does not change while an index serves a round's searches)."""
        if self.room is None:
            self.room = capacity.free_state()
        return self.room

    def moved_since(
        self, room: tuple[dict[str, int], dict[str, float | None]], capacity: Capacity
    ) -> frozenset[str]:
        """The nodes whose free cards or memory differ from ``room`` (a round before's)."""
        known = self.moved.get(id(room))
        if known is None:
            gpus, memory = self.room_of(capacity)
            known = frozenset(
                {k for k, _ in gpus.items() ^ room[0].items()}
                | {k for k, _ in memory.items() ^ room[1].items()}
            )
            self.moved[id(room)] = known
        return known

    def near_holds(self, profile: PlacementProfile, capacity: Capacity) -> bool:
        """Whether ``profile``'s best-fitting destinations are the round before's: the
        same nodes, in the same order, with the same room."""
        same = self.near_same.get(id(profile))
        if same is None:
            before = self.near_before.get(id(profile))
            same = before is not None and before == _near(profile, capacity, self.near)
            self.near_same[id(profile)] = same
        return same


@dataclass(slots=True)
class IndexMemo:
    """The round before's ``_Index`` base (placements by node, spread counts, hosts), for a
    round whose kept placements are the same less a few (a node lost): those few taken
    out of it, which is the index ``_Index`` builds from the rest (each node's list keeps
    its order, a stable sort of a subsequence being the subsequence of the sort; counts
    are counts), instead of indexing every replica again. The searches, trials and
    destinations (``near``, ``searches``, ``cleared``) hold for one round's capacity and
    budgets and start empty. Held by ``plan``'s ``carried``."""

    inventory: object = None
    demands: list[Demand] = field(default_factory=list)
    keep: list[Placement] = field(default_factory=list)
    index: _Index | None = None
    patched: int = 0
    # The round before's disruption budgets (``BudgetMemo``, defined below: a lambda).
    budgets: BudgetMemo = field(default_factory=lambda: BudgetMemo())  # noqa: PLW0108

    def index_of(
        self,
        keep: Sequence[Placement],
        demands: Sequence[Demand],
        version: object,
        domain: Domain,
        required: Collection[str],
    ) -> _Index:
        known = self.index
        changes = (
            changed_from(self.keep, keep)
            if known is not None
            and version is not None
            and version == self.inventory
            and same_objects(self.demands, demands)
            and known.spread.required == frozenset(required)
            else None
        )
        if known is None or changes is None:
            index = _Index(keep, domain, required)
        else:
            removed, added = changes
            index = known
            index.spread.domain = domain
            index.cleared_before, index.near_before = index.cleared, index.near
            index.changed = frozenset(p.model for p in (*removed, *added))
            index.searches_before = index.searches
            index.touched = frozenset(p.nodes[0] for p in (*removed, *added) if len(p.nodes) == 1)
            index.room, index.moved = None, {}
            index.near, index.searches, index.cleared, index.near_same = {}, {}, {}, {}
            gone = {id(p) for p in removed}
            models: set[str] = set()
            for p in removed:
                for n in p.nodes:
                    index.spread.count[p.model, domain(p.model, n)] -= 1
                if len(p.nodes) == 1:
                    models.add(p.model)
            for name in {p.nodes[0] for p in removed if len(p.nodes) == 1}:
                here = [p for p in index.on_node[name] if id(p) not in gone]
                if here:
                    index.on_node[name] = here
                else:
                    del index.on_node[name]
            # The placements a write added (the round after it): counted in, and each
            # node they run on listed again from ``keep`` as ``_Index`` lists it (in
            # ``keep``'s order, then sorted stably: where a new one falls among equals).
            for p in added:
                for n in p.nodes:
                    index.spread.count[p.model, domain(p.model, n)] += 1
            joined: dict[str, list[Placement]] = {
                p.nodes[0]: [] for p in added if len(p.nodes) == 1
            }
            if joined:
                for p in keep:
                    if len(p.nodes) == 1 and (listed := joined.get(p.nodes[0])) is not None:
                        listed.append(p)
                for name, listed in joined.items():
                    listed.sort(key=_largest_first)
                    index.on_node[name] = listed
                models.update(p.model for p in added if len(p.nodes) == 1)
            for model in models:
                hosts = frozenset(
                    n
                    for n in {
                        *index.hosts.get(model, ()),
                        *(p.nodes[0] for p in added if p.model == model and len(p.nodes) == 1),
                    }
                    if any(q.model == model for q in index.on_node.get(n, ()))
                )
                if hosts:
                    index.hosts[model] = hosts
                else:
                    index.hosts.pop(model, None)
            self.patched += 1
        self.inventory, self.demands, self.keep = version, list(demands), list(keep)
        self.index = index
        return index


# A model name no model has: ``_Search`` looks for replicas to move for nobody in particular.
_NOBODY = "\0"


# One node's part of a search: (its entry among ``cleared`` or None, the models that stood
# in the way there, the victim profiles whose destinations its trial looked at).
_Part = tuple[
    tuple[tuple[int, int, str], tuple[tuple[Placement, str], ...]] | None,
    frozenset[str],
    tuple[PlacementProfile, ...],
]


def _tally(
    name: str,
    part: _Part,
    blocked: Counter[str],
    blocked_on: dict[str, frozenset[str]],
    readers: dict[int, tuple[PlacementProfile, set[str]]],
) -> None:
    """One node's part added to a search's totals: what stood in the way, and which
    profiles' destination lists it read (a fresh search and a patched one alike)."""
    _, stood, read = part
    if stood:
        blocked.update(stood)
        blocked_on[name] = stood
    for seen in read:
        readers.setdefault(id(seen), (seen, set()))[1].add(name)


@dataclass(frozen=True, slots=True)
class _Ask:
    """What one search of a shape reads, the same for each of its nodes: the shape and the
    priority searched for, and the round step's capacity, index, priorities,
    movability, budgets and profiles."""

    profile: PlacementProfile
    priority: int
    capacity: Capacity
    index: _Index
    priorities: Mapping[str, int]
    movable: Mapping[str, bool]
    budget: Mapping[str, int]
    profiles: Mapping[tuple[str, str], PlacementProfile]


@dataclass(frozen=True, slots=True)
class _Search:
    """Every eligible node of one shape searched for a replica of one priority, as if for a
    model with no replicas there: which can be cleared, and what stood in the way.

    ``cleared``: ((moves, GPUs moved, node), the moves as (victim, destination)), least
    first; ``blocked``: per model, on how many nodes it stood in the way (not movable, or
    out of budget), and ``blocked_on``: on which, by node, to take a node's share out.

    What it read, for the next round to patch it (``patched``) rather than search every
    node again: ``parts``, each node's part; ``readers``, per victim profile (by
    identity) the nodes whose trial looked at its destinations; ``room``, every node's
    free room then (the round's ``_Index.room``); ``budget`` and ``movable`` as given."""

    eligible: frozenset[str]
    cleared: tuple[tuple[tuple[int, int, str], tuple[tuple[Placement, str], ...]], ...]
    blocked: Counter[str]
    blocked_on: dict[str, frozenset[str]]
    parts: dict[str, _Part] = field(default_factory=dict)
    readers: dict[int, tuple[PlacementProfile, set[str]]] = field(default_factory=dict)
    room: tuple[dict[str, int], dict[str, float | None]] | None = None
    budget: dict[str, int] = field(default_factory=dict)
    movable: dict[str, bool] = field(default_factory=dict)

    @staticmethod
    def of(ask: _Ask) -> _Search:
        """The round's search for this shape and priority, made on first use: O(N) once,
        or the round before's patched (``patched``): O(the nodes whose inputs changed).

        Holds for the one capacity, priorities, movability and budgets of the round's
        step, as ``_Index.near`` and ``_Index.cleared`` do."""
        profile, priority, capacity, index = ask.profile, ask.priority, ask.capacity, ask.index
        key = (
            profile.gpu_class,
            selector_key(profile.node_selector),
            profile.gpus_per_node,
            profile.min_memory_gb,
            priority,
        )
        known = index.searches.get(key)
        if known is not None:
            return known
        names = capacity.eligible_names(profile)
        before = index.searches_before.pop(key, None)
        search = None
        if before is not None and before.room is not None:
            search = _Search._patched(before, names, ask)
        if search is None:
            parts = {name: _Search._part(name, ask) for name in names}
            cleared = sorted(part[0] for part in parts.values() if part[0] is not None)
            blocked: Counter[str] = Counter()
            blocked_on: dict[str, frozenset[str]] = {}
            readers: dict[int, tuple[PlacementProfile, set[str]]] = {}
            for name, part in parts.items():
                _tally(name, part, blocked, blocked_on, readers)
            search = _Search(
                frozenset(names),
                tuple(cleared),
                blocked,
                blocked_on,
                parts,
                readers,
                index.room_of(capacity),
                dict(ask.budget),
                dict(ask.movable),
            )
        index.searches[key] = search
        return search

    @staticmethod
    def _part(name: str, ask: _Ask) -> _Part:
        """One node searched: its entry, what stood in the way, the profiles it read."""
        profile, priority, capacity, index = ask.profile, ask.priority, ask.capacity, ask.index
        stood: set[str] = set()
        bound = _candidates(
            name, _NOBODY, priority, profile, capacity, index.on_node.get(name, []),
            priorities=ask.priorities, movable=ask.movable, blocked=stood,
        )  # fmt: skip
        if bound is None:
            return None, _frozen(stood), ()
        found, in_the_way, read = _trial(
            name, _NOBODY, profile, capacity, index, bound[1],
            budget=ask.budget, profiles=ask.profiles,
        )  # fmt: skip
        stood.update(in_the_way)
        if found is None:
            return None, _frozen(stood), read.near
        moved = sum(victim.gpus_per_node for victim, _ in found)
        return ((len(found), moved, name), found), _frozen(stood), read.near

    @staticmethod
    def _patched(before: _Search, names: Sequence[str], ask: _Ask) -> _Search:
        """The round before's search of this shape, each node's part taken again unless
        something it read changed, as ``_still_holds`` judges a trial: its free room
        (``_Index.moved_since``), its list of placements (``_Index.touched``), the spread
        counts, budget or movability of a model with a replica there (``_Index.changed``,
        ``budget``, ``movable``; through ``_Index.hosts``), or the destinations of a
        profile its trial looked at (``_Index.near_holds``); nodes now eligible searched,
        nodes no longer dropped. The same search as one made afresh (the priorities, the
        profiles and the spread's domains are the same: ``IndexMemo`` patches an index only
        for the same demands and inventory)."""
        assert before.room is not None
        capacity, index, budget, movable = ask.capacity, ask.index, ask.budget, ask.movable
        eligible = frozenset(names)
        models = set(index.changed)
        models.update(k for k, _ in budget.items() ^ before.budget.items())
        models.update(k for k, _ in movable.items() ^ before.movable.items())
        again: set[str] = set(index.moved_since(before.room, capacity))
        again |= index.touched
        again.update(eligible - before.eligible)
        for model in models:
            again.update(index.hosts.get(model, ()))
        for seen, nodes in before.readers.values():
            if not index.near_holds(seen, capacity):
                again |= nodes
        gone = (before.eligible - eligible) | (again & before.eligible)
        parts, readers, blocked = before.parts, before.readers, before.blocked
        blocked_on = before.blocked_on
        for name in gone:
            old = parts.pop(name, None)
            if old is None:
                continue
            if old[1]:
                blocked.subtract(old[1])
                del blocked_on[name]
            for seen in old[2]:
                readers[id(seen)][1].discard(name)
        cleared = [entry for entry in before.cleared if entry[0][2] not in gone]
        again &= eligible
        for name in again:
            part = parts[name] = _Search._part(name, ask)
            if part[0] is not None:
                cleared.append(part[0])
            _tally(name, part, blocked, blocked_on, readers)
        for model in [m for m, n in blocked.items() if n <= 0]:
            del blocked[model]
        for key in [k for k, (_, nodes) in readers.items() if not nodes]:
            del readers[key]
        cleared.sort()
        index.searches_patched += 1
        index.searched_again += len(again)
        index.reused += len(eligible) - len(again)
        return _Search(
            eligible,
            tuple(cleared),
            blocked,
            blocked_on,
            parts,
            readers,
            index.room_of(capacity),
            dict(budget),
            dict(movable),
        )

    def blocked_without(self, nodes: Collection[str]) -> list[str]:
        """The models that stood in the way on some eligible node not among ``nodes``."""
        left = Counter(self.blocked)
        for name in nodes:
            left.subtract(self.blocked_on.get(name, ()))
        return [model for model, n in left.items() if n > 0]


class _Spread:
    """How many replicas of each model each spread domain holds, moved as moves are tried."""

    def __init__(
        self, placements: Sequence[Placement], domain: Domain, required: Collection[str]
    ) -> None:
        self.domain = domain
        self.required = frozenset(required)
        self.count: Counter[tuple[str, str]] = Counter()
        for p in placements:
            for n in p.nodes:
                self.count[p.model, domain(p.model, n)] += 1

    def allows(self, model: str, source: str, to: str) -> bool:
        """Whether a required spread survives moving one replica of ``model`` from node
        ``source`` to ``to``: the destination's domain ends with no more replicas of it
        than the source's had."""
        if model not in self.required:
            return True
        a, b = self.domain(model, source), self.domain(model, to)
        return a == b or self.count[model, b] + 1 <= self.count[model, a]

    def holds(self, model: str, node: str) -> int:
        return self.count[model, self.domain(model, node)]

    def move(self, model: str, source: str, to: str) -> None:
        self.count[model, self.domain(model, source)] -= 1
        self.count[model, self.domain(model, to)] += 1


def _by_node(model: str, node: str) -> str:
    return node


# How many of the best-fitting destinations are looked at for one without the moved
# model's replicas: bounded, so a move costs the same on 10 nodes or 10,000.
_LOOK = 64


def _candidates(  # noqa: PLR0917
    name: str,
    model: str,
    priority: int,
    profile: PlacementProfile,
    capacity: Capacity,
    here: list[Placement],
    *,
    priorities: Mapping[str, int],
    movable: Mapping[str, bool],
    blocked: set[str],
) -> tuple[int, list[Placement]] | None:
    """The replicas on ``name`` that may make room for ``profile``, largest first, and the
    fewest of them that free enough cards; None if all of them would not."""
    gpus = capacity.free_gpus(name)
    candidates = []
    for p in here:
        if p.model == model or priorities.get(p.model, 0) > priority:
            continue
        if not movable.get(p.model, True):
            blocked.add(p.model)
            continue
        candidates.append(p)
    # Largest first (``here`` is in that order already): the fewest moves free the most cards.
    need, freed, least = profile.gpus_per_node - gpus, 0, 0
    for p in candidates:
        if freed >= need:
            break
        freed += p.gpus_per_node
        least += 1
    if freed < need:
        return None
    return least, candidates


def _largest_first(p: Placement) -> tuple[int, int, str, int]:
    return (-p.gpus_per_node, -p.memory_gb_per_node, p.model, p.replica)


def _clear(
    name: str,
    model: str,
    profile: PlacementProfile,
    capacity: Capacity,
    *,
    candidates: list[Placement],
    budget: Mapping[str, int],
    blocked_by_budget: set[str],
    profiles: Mapping[tuple[str, str], PlacementProfile],
    spread: _Spread,
    most: int | None,
    near: Near,
    trial: _Trial,
) -> tuple[Move, ...] | None:
    """The fewest of ``candidates`` to move elsewhere so that ``profile`` fits on ``name``.

    ``most``: the fewest moves found on another node so far; a node that would need
    more is given up. ``trial``: what the moves tried so far (this node's, and for a
    gang the other nodes' cleared before it) took; the caller undoes it."""
    gpus, memory = capacity.free_gpus(name), capacity.free_memory(name)
    if gpus_fit(gpus, profile.gpus_per_node) and memory_fits(memory, profile.min_memory_gb):
        return ()  # it fits as it is: nothing to move (the planner would have placed it)
    used, spent = trial.used, trial.spent
    moves: list[Move] = []
    for victim in candidates:
        if gpus_fit(gpus, profile.gpus_per_node) and memory_fits(memory, profile.min_memory_gb):
            break
        if most is not None and len(moves) >= most:
            return None
        limit = budget.get(victim.model)
        if limit is not None and spent.get(victim.model, 0) >= limit:
            blocked_by_budget.add(victim.model)
            continue
        own = profiles.get((victim.model, victim.profile))
        to = None if own is None else _destination(victim, name, capacity, own, spread, trial, near)
        if to is None:
            continue
        g, m = used.get(to, (0, 0.0))
        used[to] = (g + victim.gpus_per_node, m + victim.memory_gb_per_node)
        spread.move(victim.model, name, to)
        trial.moved.append((victim.model, name, to))
        spent[victim.model] = spent.get(victim.model, 0) + 1
        gpus += victim.gpus_per_node
        memory = None if memory is None else memory + victim.memory_gb_per_node
        moves.append(
            Move(
                victim,
                to,
                f"to make room for model {model}, profile {profile.name} on node {name}",
            )
        )
    if gpus_fit(gpus, profile.gpus_per_node) and memory_fits(memory, profile.min_memory_gb):
        return tuple(moves)
    return None


@dataclass(slots=True)
class _Trial:
    """What one search's moves took so far, shared by the nodes of a gang.

    ``cleared``: the nodes made room on, which no move may land on; ``used``: cards and
    memory the moves took on their destinations (no Capacity copy: a copy per node
    tried would cost O(N) each, O(N^2) a search); ``spent``: moves per model, against
    its budget; ``moved``: (model, from, to) applied to the shared spread counts."""

    cleared: frozenset[str]
    used: dict[str, tuple[int, float]] = field(default_factory=dict)
    spent: dict[str, int] = field(default_factory=dict)
    moved: list[tuple[str, str, str]] = field(default_factory=list)
    # The victim profiles whose destinations were looked at, in order (``_Read``).
    read: list[PlacementProfile] = field(default_factory=list)

    def undo(self, spread: _Spread) -> None:
        for model, source, to in reversed(self.moved):
            spread.move(model, to, source)
        self.moved.clear()


# How many of the best-fitting destinations a round keeps for each profile moved (the
# first _LOOK, and some spare for those the trial itself fills).
_KEEP = _LOOK + 16


# id(profile) -> its best-fitting nodes and their free cards and memory (``_destination``).
Near = dict[int, tuple[list[str], tuple[tuple[int, float | None], ...]]]


def _near(
    profile: PlacementProfile, capacity: Capacity, near: Near
) -> tuple[list[str], tuple[tuple[int, float | None], ...]]:
    """The best-fitting nodes of ``profile`` (read once a round), with their room: what
    ``_destination`` reads of capacity, for ``_Index.near_holds`` a round later."""
    known = near.get(id(profile))
    if known is None:
        names = [name for _, _, name in islice(capacity.fitting(profile), _KEEP)]
        room = tuple((capacity.free_gpus(n), capacity.free_memory(n)) for n in names)
        known = near[id(profile)] = (names, room)
    return known


def _destination(  # noqa: PLR0917
    victim: Placement,
    away_from: str,
    capacity: Capacity,
    profile: PlacementProfile,
    spread: _Spread,
    trial: _Trial,
    near: Near,
) -> str | None:
    """The best-fitting other fresh node of the victim's own profile (class, labels,
    memory) with room once the trial's earlier moves are counted, within its spread
    rule; one without its model's replicas if one of the first few is.

    The best-fitting nodes of each profile are read from ``capacity`` once a round
    (``near``, by the profile's identity: capacity does not change during a search)."""
    fitting = _near(profile, capacity, near)[0]
    if not any(seen is profile for seen in trial.read):
        trial.read.append(profile)
    first = None
    looked = 0
    used, cleared = trial.used, trial.cleared
    for name in fitting:
        if name in cleared or not spread.allows(victim.model, away_from, name):
            continue
        if name in used:
            g, m = used[name]
            memory = capacity.free_memory(name)
            if not gpus_fit(capacity.free_gpus(name) - g, profile.gpus_per_node) or not (
                memory_fits(None if memory is None else memory - m, profile.min_memory_gb)
            ):
                continue
        if spread.holds(victim.model, name) == 0:
            return name
        if first is None:
            first = name
        looked += 1
        if looked >= _LOOK:
            break
    return first


# -- the round's step ------------------------------------------------------------


@dataclass(slots=True)
class Defragmented:
    """What the round's defragmentation step decided.

    ``moves``: moves started this round, each with the copy placed on its destination;
    ``keep``: the kept placements, the moved ones now carrying ``moving``;
    ``notes``: (model, text) for an unplaced model: the moves under way for it, or why
    none could be planned (which budget stood in the way)."""

    keep: list[Placement]
    moves: list[Move] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)


Budgets = tuple[dict[str, int], dict[str, bool], dict[str, str]]


def budgets(
    demands: Sequence[Demand], placements: Sequence[Placement], lifecycle: Lifecycle
) -> Budgets:
    """Per model: how many more replicas may be put in motion (absent: any number), whether
    it may be moved at all, and its budget in words for a refusal.

    A model whose ready replicas are already below ``scaling.min`` is not disturbed
    (its budget is 0); otherwise its ``disruption.max_unavailable`` (N, or N% of its
    wanted replicas rounded down) caps the replicas in motion at once, those already
    moving counted."""
    ready, moving = _counted(placements, lifecycle.statuses)
    answer: Budgets = ({}, {}, {})
    for d in demands:
        _budget_of(d, ready[d.model], moving[d.model], answer)
    return answer


def _counted(
    placements: Iterable[Placement], statuses: Mapping[tuple[str, int], ReplicaStatus]
) -> tuple[Counter[str], Counter[str]]:
    """Per model, its placements that count as ready and those moving."""
    ready: Counter[str] = Counter()
    moving: Counter[str] = Counter()
    for p in placements:
        if _ready(statuses.get((p.model, p.replica))):
            ready[p.model] += 1
        if p.moving:
            moving[p.model] += 1
    return ready, moving


def _ready(status: ReplicaStatus | None) -> bool:
    return status is None or status.counts_as_ready


def _budget_of(d: Demand, ready: int, moving: int, answer: Budgets) -> None:
    """One model's entries of ``budgets``, set in ``answer`` (absent ones left absent)."""
    budget, movable, why = answer
    spec = d.lifecycle or ModelLifecycle()
    if not spec.movable:
        movable[d.model] = False
        why[d.model] = "disruption.movable is false"
        return
    if ready < spec.min_ready:
        budget[d.model] = 0
        why[d.model] = f"{ready} ready, below its scaling.min {spec.min_ready}: not disturbed"
        return
    cap = max_moving(spec.max_moving, d.replicas)
    if cap is None:
        return
    budget[d.model] = max(cap - moving, 0)
    why[d.model] = f"disruption.max_unavailable {spec.max_moving!r} allows {cap} in motion"
    if moving:
        why[d.model] += f", {moving} already moving"


@dataclass(slots=True)
class BudgetMemo:
    """``budgets`` of the round before, for a round whose kept placements are the round
    before's less and plus a few (a node lost, a write read back) with the same demands:
    the ready and moving counts of the kept placements patched by those few and by the
    replica states that changed, the few other placements (placed this round, held by a
    rollout) counted afresh, and only the models whose counts moved judged again. A
    model's entries read its demand and its two counts alone, so the others' are the
    round before's. Held by ``IndexMemo``."""

    demands: list[Demand] = field(default_factory=list)
    keep: list[Placement] = field(default_factory=list)
    statuses: Mapping[tuple[str, int], ReplicaStatus] = field(default_factory=dict)
    # How many kept placements hold each slot, and the kept ones' counts.
    slots: Counter[tuple[str, int]] = field(default_factory=Counter)
    ready: Counter[str] = field(default_factory=Counter)
    moving: Counter[str] = field(default_factory=Counter)
    # The models the other placements (not kept) counted for the round before; the
    # counts (ready, moving) each model's entries were judged from, and the entries.
    among_others: set[str] = field(default_factory=set)
    totals: dict[str, tuple[int, int]] = field(default_factory=dict)
    answer: Budgets = field(default_factory=lambda: ({}, {}, {}))
    patched: int = 0

    def of(
        self,
        demands: Sequence[Demand],
        keep: Sequence[Placement],
        others: Sequence[Placement],
        lifecycle: Lifecycle,
    ) -> Budgets:
        """``budgets(demands, (*keep, *others), lifecycle)``: copies, the caller's to change."""
        statuses = lifecycle.statuses
        changes = changed_from(self.keep, keep) if same_objects(self.demands, demands) else None
        if changes is None:
            self._count(demands, keep, statuses)
            models: Iterable[str] = [d.model for d in demands]
        else:
            models = self._patch(changes, statuses)
            self.patched += 1
        ready_others, moving_others = _counted(others, statuses)
        among = {*ready_others, *moving_others}
        self._judge(
            demands,
            {*models, *among, *self.among_others},
            ready_others,
            moving_others,
            whole=changes is None,
        )
        self.keep, self.statuses, self.among_others = list(keep), statuses, among
        budget, movable, why = self.answer
        return dict(budget), dict(movable), dict(why)

    def _count(
        self,
        demands: Sequence[Demand],
        keep: Sequence[Placement],
        statuses: Mapping[tuple[str, int], ReplicaStatus],
    ) -> None:
        self.demands = list(demands)
        self.ready, self.moving = _counted(keep, statuses)
        self.slots = Counter((p.model, p.replica) for p in keep)
        self.totals, self.answer = {}, ({}, {}, {})

    def _patch(
        self,
        changes: tuple[list[Placement], list[Placement]],
        statuses: Mapping[tuple[str, int], ReplicaStatus],
    ) -> set[str]:
        """The kept counts moved by the states that changed and the placements gone and
        come; the models whose counts may have moved."""
        models: set[str] = set()
        old = self.statuses
        if statuses is not old:
            # The kept placements' states that changed (another object, or gone or new),
            # counted over the kept placements of the round before.
            for key in _moved_keys(old, statuses):
                held = self.slots.get(key, 0)
                if held:
                    self.ready[key[0]] += held * (_ready(statuses.get(key)) - _ready(old.get(key)))
                    models.add(key[0])
        removed, added = changes
        for p, step in (*((p, -1) for p in removed), *((p, 1) for p in added)):
            key = (p.model, p.replica)
            self.slots[key] += step
            if not self.slots[key]:
                del self.slots[key]
            self.ready[p.model] += step * _ready(statuses.get(key))
            self.moving[p.model] += step * bool(p.moving)
            models.add(p.model)
        return models

    def _judge(
        self,
        demands: Sequence[Demand],
        models: Iterable[str],
        ready_others: Counter[str],
        moving_others: Counter[str],
        *,
        whole: bool,
    ) -> None:
        """The entries of each model of ``models`` whose counts moved since they were
        judged, judged again (every model's, ``whole``); every other model's counts are
        those it was judged from."""
        by_model = {d.model: d for d in demands}
        answer = self.answer
        for model in models:
            total = (
                self.ready[model] + ready_others[model],
                self.moving[model] + moving_others[model],
            )
            if not whole and self.totals.get(model) == total:
                continue
            self.totals[model] = total
            for part in answer:
                part.pop(model, None)
            d = by_model.get(model)
            if d is not None:
                _budget_of(d, total[0], total[1], answer)


def _moved_keys(
    old: Mapping[tuple[str, int], ReplicaStatus], new: Mapping[tuple[str, int], ReplicaStatus]
) -> list[tuple[str, int]]:
    """The keys whose state is another object in ``new`` than in ``old``, or in one only:
    a pass over ``new`` (a feed patches the states it read again and keeps the others'
    objects), and over ``old`` only when some key went."""
    moved = [k for k, v in new.items() if old.get(k) is not v]
    came = sum(1 for k in moved if k not in old)
    if len(old) + came != len(new):
        moved.extend(old.keys() - new.keys())
    return moved


def max_moving(value: int | str | None, wanted: int) -> int | None:
    """``disruption.max_unavailable`` as a count: N, or N% of ``wanted`` rounded down."""
    if value is None:
        return None
    if isinstance(value, str):
        return max(wanted, 0) * int(value.rstrip("%")) // 100
    return value


def defragment(
    demands: Sequence[Demand],
    unplaced: Mapping[str, Sequence[PlacementProfile]],
    keep: Sequence[Placement],
    others: Sequence[Placement],
    capacity: Capacity,
    *,
    lifecycle: Lifecycle,
    inventory: Mapping[str, Node],
    reserved: Mapping[str, set[int]] | None = None,
    rolling: Collection[str] = (),
    avoid: Mapping[str, frozenset[str]] | None = None,
    repair_all_spreads: bool = False,
    memo: IndexMemo | None = None,
    inventory_version: object = None,
) -> Defragmented:
    """The round's step: plan one defragmentation (or one spread repair) if none is under way.

    ``repair_all_spreads`` (``[scheduler] repair_spread``): every movable model's spread
    is repaired, not only those that opted in with ``disruption.repair_spread``.
    ``memo``: the round before's index, patched when only a few kept placements went
    (``IndexMemo``); ``inventory_version`` names the nodes' content (None: unknown).

    ``unplaced``: model -> the profiles its unplaced replicas tried. ``keep``: the
    placements kept this round (the only ones moved); ``others``: every other placement
    after the round (placed now, or held by a rollout), which take their slots and
    room. ``capacity`` is what is free after the round and is consumed by the copies."""
    out = Defragmented(keep=list(keep))
    under_way = [p for p in (*keep, *others) if p.moving]
    if under_way:
        for model in unplaced:
            mine = sorted({p.moving for p in under_way if p.moving_for == model})
            if mine:
                out.notes[model] = f"waiting for {len(under_way)} move(s) under way: " + "; ".join(
                    mine
                )
            else:
                out.notes[model] = (
                    f"not defragmenting yet: {len(under_way)} move(s) under way "
                    f"({under_way[0].moving})"
                )
        return out
    by_model = {d.model: d for d in demands}
    everything = (*keep, *others)
    budget, movable, why = (
        budgets(demands, everything, lifecycle)
        if memo is None
        else memo.budgets.of(demands, keep, others, lifecycle)
    )
    domain = _domains(demands, inventory)
    priorities = {d.model: d.priority for d in demands}
    profiles = {(d.model, p.name): p for d in demands for p in d.profiles}
    required = {d.model for d in demands if d.spread_required}
    # Built once for every search of the round (a search moves and restores its counts).
    index: _Index | None = None
    # ``_fits_in_total`` by what it reads: capacity does not change until a move starts.
    totals: dict[tuple[object, ...], bool] = {}
    # A model in a rollout is moved by nothing else meanwhile.
    for model in rolling:
        movable[model] = False
        why[model] = "a rollout is under way"
    for demand in placement_order(demands):
        tried = unplaced.get(demand.model)
        if not tried:
            continue
        refusals = []
        for profile in tried:
            # Said nothing of when defragmenting cannot help: what the counts say is why.
            if not _fits_in_total(profile, capacity, totals):
                continue
            found = moves_for(
                demand.model,
                demand.priority,
                profile,
                capacity,
                keep,
                priorities=priorities,
                budget=budget,
                profiles=profiles,
                movable=movable,
                why=why,
                domain=domain,
                required=required,
                avoid=(avoid or {}).get(demand.model, ()),
                index=index
                if index is not None
                else (
                    index := _Index(keep, domain, required)
                    if memo is None
                    else memo.index_of(keep, demands, inventory_version, domain, required)
                ),
            )
            if found.node is not None and found.moves:
                _start(
                    out,
                    found.moves,
                    demand.model,
                    demands=by_model,
                    everything=everything,
                    capacity=capacity,
                    reserved=reserved,
                )
                where = (
                    f"node {found.node}"
                    if len(found.nodes) == 1
                    else "nodes " + ", ".join(found.nodes)
                )
                out.notes[demand.model] = (
                    f"moving {len(found.moves)} replica(s) to make room on {where}"
                )
                return out
            # Only a budget is worth saying: that nothing else could be moved adds
            # nothing to the counts (and is said of every unplaced replica otherwise).
            if found.blocked:
                refusals.append(f"profile {profile.name}: {found.refusal}")
        if refusals:
            out.notes[demand.model] = "not defragmented: " + "; ".join(refusals)
    _repair_spread(
        out,
        demands,
        by_model=by_model,
        everything=everything,
        capacity=capacity,
        budget=budget,
        movable=movable,
        domain=domain,
        reserved=reserved,
        every_model=repair_all_spreads,
    )
    return out


def _fits_in_total(
    profile: PlacementProfile, capacity: Capacity, known: dict[tuple[object, ...], bool]
) -> bool:
    """Whether the free cards of the profile's eligible nodes add up to one replica; for a
    gang, those of one fabric, among at least ``profile.nodes`` of its nodes large enough
    to hold a share each.

    ``known``: the answers so far, by what they read (class, labels, cards, nodes), for
    a capacity that has not changed since: one scan of the eligible nodes per shape, not
    per unplaced profile (which grew with the fleet times the models left unplaced)."""
    if profile.gpus_per_node == 0:
        return False  # a CPU replica needs no cards: nothing to gain by moving others
    key = (
        profile.gpu_class,
        selector_key(profile.node_selector),
        profile.gpus_per_node,
        profile.nodes,
    )
    answer = known.get(key)
    if answer is None:
        answer = known[key] = _fits_in_total_now(profile, capacity)
    return answer


def _fits_in_total_now(profile: PlacementProfile, capacity: Capacity) -> bool:
    if profile.nodes > 1:
        need = profile.gpus_per_node * profile.nodes
        # fabric -> (free cards, nodes with enough cards in all)
        fabrics: dict[str, tuple[int, int]] = {}
        for name in capacity.eligible_names(profile):
            n = capacity.node(name)
            if n.fabric is None or n.gpus - n.gpus_reserved < profile.gpus_per_node:
                continue
            free, count_ = fabrics.get(n.fabric, (0, 0))
            # Cards beyond one share are no use to a gang on that node.
            share = min(max(capacity.free_gpus(name), 0), profile.gpus_per_node)
            free, count_ = free + share, count_ + 1
            fabrics[n.fabric] = (free, count_)
            if free >= need and count_ >= profile.nodes:
                return True
        return False
    total = 0
    for name in capacity.eligible_names(profile):
        total += capacity.free_gpus(name)
        if total >= profile.gpus_per_node:
            return True
    return False


def _domains(demands: Sequence[Demand], inventory: Mapping[str, Node]) -> Domain:
    label = {d.model: d.spread_by for d in demands if d.spread_by}

    def domain(model: str, node: str) -> str:
        key = label.get(model)
        if key is None:
            return node
        n = inventory.get(node)
        # A node without the label is a domain of its own (as ``scheduler.planner.spread``).
        return f"={n.labels[key]}" if n is not None and key in n.labels else node

    return domain


def _start(
    out: Defragmented,
    moves: Sequence[Move],
    beneficiary: str,
    *,
    demands: Mapping[str, Demand],
    everything: Sequence[Placement],
    capacity: Capacity,
    reserved: Mapping[str, set[int]] | None,
) -> None:
    """Mark each moved placement and place its copy on the move's destination."""
    taken: dict[str, set[int]] = {}
    for p in everything:
        taken.setdefault(p.model, set()).add(p.replica)
    for model, slots in (reserved or {}).items():
        taken.setdefault(model, set()).update(slots)
    marked: dict[tuple[str, int], Placement] = {}
    for move in moves:
        victim = move.placement
        spec = demands[victim.model].lifecycle or ModelLifecycle()
        slots = taken.setdefault(victim.model, set())
        slot = next(s for s in count() if s not in slots)
        slots.add(slot)
        copy = replace(
            victim,
            replica=slot,
            nodes=(move.to,),
            fingerprint=spec.fingerprints.get(victim.profile, victim.fingerprint),
            version=spec.version or victim.version,
            moving="",
            moving_for="",
        )
        capacity.consume(copy.nodes, copy.gpus_per_node, copy.memory_gb_per_node)
        moving = replace(victim, moving=move.reason, moving_for=beneficiary)
        marked[victim.model, victim.replica] = moving
        out.moves.append(Move(moving, move.to, move.reason, copy))
    out.keep = [marked.get((p.model, p.replica), p) for p in out.keep]


def _repair_spread(
    out: Defragmented,
    demands: Sequence[Demand],
    *,
    by_model: Mapping[str, Demand],
    everything: Sequence[Placement],
    capacity: Capacity,
    budget: Mapping[str, int],
    movable: Mapping[str, bool],
    domain: Domain,
    reserved: Mapping[str, set[int]] | None,
    every_model: bool = False,
) -> None:
    """One move that repairs a worsened spread, for the first model that opted in
    (``disruption.repair_spread``, or every model under the cluster's policy) and has
    one: a replica on its most crowded domain moves to a fitting node of a domain
    holding at least two fewer of its replicas. ``movable: false`` is never moved."""
    profiles = {(d.model, p.name): p for d in demands for p in d.profiles}
    for demand in demands:
        spec = demand.lifecycle
        if spec is None or not (spec.repair_spread or every_model):
            continue
        if not movable.get(demand.model, True):
            continue
        if budget.get(demand.model, 1) <= 0:
            continue
        mine = [p for p in out.keep if p.model == demand.model and len(p.nodes) == 1]
        if len(mine) < 2:
            continue
        held = Counter(
            domain(demand.model, n) for p in everything if p.model == demand.model for n in p.nodes
        )
        # The most crowded domain first, then its highest slot (the order surplus goes in).
        mine.sort(key=lambda p: (-held[domain(demand.model, p.nodes[0])], -p.replica))
        victim = mine[0]
        source = domain(demand.model, victim.nodes[0])
        if held[source] < 2:
            continue
        profile = profiles.get((demand.model, victim.profile))
        if profile is None:
            continue
        for _, _, name in capacity.fitting(profile):
            if held[domain(demand.model, name)] + 2 <= held[source]:
                reason = (
                    f"to repair the spread of model {demand.model}: {held[source]} of its "
                    f"replicas share {_where(source)}"
                )
                _start(
                    out,
                    [Move(victim, name, reason)],
                    "",
                    demands=by_model,
                    everything=everything,
                    capacity=capacity,
                    reserved=reserved,
                )
                out.notes.setdefault(demand.model, reason)
                return


def _where(domain: str) -> str:
    return f"label value {domain[1:]}" if domain.startswith("=") else f"node {domain}"
