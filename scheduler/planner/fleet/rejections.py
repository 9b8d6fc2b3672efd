"""Why a replica fits nowhere, as counts per reason and as a sentence.

The counts are data (``ProfileRejections``) so an API can return them as they
are; ``render`` turns them into the line an operator reads, in the manner of
``profile a100-tp8: 0/4278 nodes fit: 3880 gpu_class is A10 not A100, 390 have
fewer than 8 free GPUs, 8 lack label zone=eu``. Each node is counted once,
under the first check it fails (see ``scheduler.planner.fleet.fit.Check``).

Counting scans every node, O(N) per profile; the planner does it only for
profiles that failed, once per profile, after the round.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

from catalog.definition.views import PlacementProfile
from scheduler.planner.fleet.fit import Check, memory_fits, missing_label
from scheduler.planner.fleet.inventory import Node

# One node's place in a profile's counts: the first check it fails and its detail, or
# (None, its fabric) when it fits (``RejectionMemo``).
_Outcome = tuple[Check | None, str | None]


class FreeCapacity(Protocol):
    """What is left on each node; ``scheduler.planner.fleet.capacity.Capacity`` is one."""

    def free_gpus(self, name: str) -> int: ...

    def free_memory(self, name: str) -> float | None: ...


@dataclass(frozen=True, slots=True)
class ProfileRejections:
    """How many nodes one profile was refused by, per first failing check.

    ``wrong_gpu_class`` counts nodes by the card type they have instead;
    ``without_gpus`` counts nodes with no cards. ``missing_labels`` counts nodes
    by the first selector label (``key=value``, by key) they lack. For a
    multi-node profile (``nodes_needed`` > 1), ``nodes_fit`` counts nodes that
    would fit on their own, ``largest_fabric_group`` the most of those sharing
    one fabric, and ``fit_without_fabric`` those with no fabric at all.
    Mappings are ordered by count, largest first, then by name.
    """

    profile: str
    nodes_total: int
    nodes_fit: int
    stale: int = 0
    cordoned: int = 0
    backing_off: int = 0
    gpu_class_wanted: str | None = None
    wrong_gpu_class: Mapping[str, int] = field(default_factory=dict)
    without_gpus: int = 0
    gpus_needed: int = 0
    too_few_gpus: int = 0
    missing_labels: Mapping[str, int] = field(default_factory=dict)
    memory_needed_gb: int = 0
    too_little_memory: int = 0
    nodes_needed: int = 1
    largest_fabric_group: int = 0
    fit_without_fabric: int = 0


@dataclass(frozen=True, slots=True)
class ClassIndex:
    """The inventory grouped by GPU class, with how many of each class are stale.

    For a GPU profile every node of another class fails at the class check (or
    earlier, if stale) whatever else is true of it, so those nodes can be
    counted by class in bulk; only nodes of the wanted class need looking at.
    Built once per round, it turns each count from O(N) into O(nodes of one
    class).
    """

    by_class: Mapping[str | None, Sequence[Node]]
    stale: Mapping[str | None, int]
    # Fresh but cordoned or draining, per class (a stale node counts as stale).
    closed: Mapping[str | None, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls, nodes: Sequence[Node], fresh: Collection[str], closed: Collection[str] = ()
    ) -> ClassIndex:
        by_class: dict[str | None, list[Node]] = {}
        stale: Counter[str | None] = Counter()
        shut: Counter[str | None] = Counter()
        for node in nodes:
            by_class.setdefault(node.gpu_class, []).append(node)
            if node.name not in fresh:
                stale[node.gpu_class] += 1
            elif node.name in closed:
                shut[node.gpu_class] += 1
        return cls(by_class, stale, shut)


def count_rejections(
    profile: PlacementProfile,
    nodes: Sequence[Node],
    *,
    fresh: Collection[str],
    capacity: FreeCapacity,
    index: ClassIndex | None = None,
    closed: Collection[str] = (),
    avoid: Collection[str] = (),
) -> ProfileRejections:
    """Count, for each node, the first check it fails for ``profile``.

    O(N); with an ``index`` (same nodes, same ``fresh``), O(nodes of the
    profile's class) for a GPU profile, with the same counts.
    """
    failures: Counter[tuple[Check, str]] = Counter()
    fabric_sizes: Counter[str] = Counter()
    examined: Sequence[Node] = nodes
    if index is not None and profile.gpu_class is not None:
        examined = index.by_class.get(profile.gpu_class, ())
        for gpu_class, members in index.by_class.items():
            if gpu_class == profile.gpu_class:
                continue
            stale = index.stale.get(gpu_class, 0)
            shut = index.closed.get(gpu_class, 0)
            failures[Check.STALE, ""] += stale
            failures[Check.CORDONED, ""] += shut
            if len(members) > stale + shut:
                failures[Check.GPU_CLASS, gpu_class or ""] += len(members) - stale - shut
    fit_without_fabric = _count_examined(
        profile, examined, fresh, capacity, closed, avoid, failures, fabric_sizes
    )
    return _assemble(profile, len(nodes), failures, fabric_sizes, fit_without_fabric)


def _assemble(
    profile: PlacementProfile,
    total: int,
    failures: Mapping[tuple[Check, str], int],
    fabric_sizes: Mapping[str, int],
    fit_without_fabric: int,
) -> ProfileRejections:
    """The counts as ``ProfileRejections`` (zero counts, left by a memo's recount, dropped)."""
    failures = Counter({k: n for k, n in failures.items() if n})
    nodes = range(total)
    wrong_classes = {cls: n for (check, cls), n in failures.items() if check is Check.GPU_CLASS}
    return ProfileRejections(
        profile=profile.name,
        nodes_total=len(nodes),
        nodes_fit=len(nodes) - sum(failures.values()),
        stale=failures[Check.STALE, ""],
        cordoned=failures[Check.CORDONED, ""],
        backing_off=failures[Check.BACKOFF, ""],
        gpu_class_wanted=profile.gpu_class,
        wrong_gpu_class=_by_count({cls: n for cls, n in wrong_classes.items() if cls}),
        without_gpus=wrong_classes.get("", 0),
        gpus_needed=profile.gpus_per_node,
        too_few_gpus=failures[Check.FREE_GPUS, ""],
        missing_labels=_by_count(
            {label: n for (check, label), n in failures.items() if check is Check.LABELS}
        ),
        memory_needed_gb=profile.min_memory_gb,
        too_little_memory=failures[Check.MEMORY, ""],
        nodes_needed=profile.nodes,
        largest_fabric_group=max(fabric_sizes.values(), default=0),
        fit_without_fabric=fit_without_fabric,
    )


def _count_examined(  # noqa: PLR0917
    profile: PlacementProfile,
    examined: Sequence[Node],
    fresh: Collection[str],
    capacity: FreeCapacity,
    closed: Collection[str],
    avoid: Collection[str],
    failures: Counter[tuple[Check, str]],
    fabric_sizes: Counter[str],
) -> int:
    """``fit.misfit`` node by node, inlined: a round that leaves replicas unplaced
    explains them every time, and the call and the ``Misfit`` per node were most of it.
    The checks and their order are ``misfit``'s (a property test holds them equal). Adds to
    ``failures`` and ``fabric_sizes``; returns how many fit without a fabric."""
    wanted, needed = profile.gpu_class, profile.gpus_per_node
    selector, memory_needed = profile.node_selector, profile.min_memory_gb
    stale = shut = backing_off = few_gpus = little_memory = 0
    without_fabric = 0
    other: Counter[str] = Counter()
    free_gpus, free_memory = capacity.free_gpus, capacity.free_memory
    for node in examined:
        name = node.name
        if name not in fresh:
            stale += 1
        elif name in closed:
            shut += 1
        elif wanted is not None and node.gpu_class != wanted:
            other[node.gpu_class or ""] += 1
        elif selector and (label := missing_label(node.labels, selector)) is not None:
            failures[Check.LABELS, label] += 1
        elif name in avoid:
            backing_off += 1
        elif needed != 0 and free_gpus(name) < needed:
            few_gpus += 1
        elif not memory_fits(free_memory(name), memory_needed):
            little_memory += 1
        elif node.fabric is None:
            without_fabric += 1
        else:
            fabric_sizes[node.fabric] += 1
    for check, n in (
        (Check.STALE, stale),
        (Check.CORDONED, shut),
        (Check.BACKOFF, backing_off),
        (Check.FREE_GPUS, few_gpus),
        (Check.MEMORY, little_memory),
    ):
        if n:
            failures[check, ""] += n
    for gpu_class, n in other.items():
        failures[Check.GPU_CLASS, gpu_class] += n
    return without_fabric


def render(rejections: Sequence[ProfileRejections]) -> str:
    """One clause per profile tried, in the order tried, joined with "; "."""
    return "; ".join(render_profile(r) for r in rejections)


def render_profile(r: ProfileRejections) -> str:
    """``profile NAME: FIT/TOTAL nodes fit[ gang note]: reason, reason, ...``."""
    head = f"profile {r.profile}: {r.nodes_fit}/{r.nodes_total} nodes fit"
    if r.nodes_needed > 1:
        head += _gang_note(r)
    if r.nodes_total == 0:
        return head + " (no nodes are reported)"
    reasons = _reasons(r)
    return f"{head}: {', '.join(reasons)}" if reasons else head


def _gang_note(r: ProfileRejections) -> str:
    if r.nodes_fit < r.nodes_needed:
        return f", {r.nodes_needed} needed on one fabric"
    details = []
    if r.largest_fabric_group:
        details.append(f"the most on one fabric is {r.largest_fabric_group}")
    if r.fit_without_fabric:
        count = r.fit_without_fabric
        details.append(f"{count} {_verb(count, 'has', 'have')} no fabric")
    return f" but no fabric has {r.nodes_needed} of them ({'; '.join(details)})"


def _reasons(r: ProfileRejections) -> list[str]:
    reasons = []
    if r.stale:
        reasons.append(f"{r.stale} {_verb(r.stale, 'is', 'are')} stale")
    if r.cordoned:
        reasons.append(f"{r.cordoned} {_verb(r.cordoned, 'is', 'are')} cordoned or draining")
    reasons.extend(_gpu_class_reasons(r))
    for label, count in r.missing_labels.items():
        reasons.append(f"{count} {_verb(count, 'lacks', 'lack')} label {label}")
    if r.backing_off:
        reasons.append(
            f"{r.backing_off} {_verb(r.backing_off, 'is', 'are')} backing off after "
            "this model failed there"
        )
    if r.too_few_gpus:
        reasons.append(
            f"{r.too_few_gpus} {_verb(r.too_few_gpus, 'has', 'have')} "
            + ("no free GPU" if r.gpus_needed == 1 else f"fewer than {r.gpus_needed} free GPUs")
        )
    if r.too_little_memory:
        reasons.append(
            f"{r.too_little_memory} {_verb(r.too_little_memory, 'has', 'have')} "
            f"less than {r.memory_needed_gb} GB free memory"
        )
    return reasons


def _gpu_class_reasons(r: ProfileRejections) -> list[str]:
    classes = list(r.wrong_gpu_class.items())
    if len(classes) == 1 and not r.without_gpus:
        ((cls, count),) = classes
        return [f"{count} gpu_class is {cls} not {r.gpu_class_wanted}"]
    if not classes and not r.without_gpus:
        return []
    if not classes:
        return [f"{r.without_gpus} {_verb(r.without_gpus, 'has', 'have')} no GPU"]
    parts = [f"{count} {cls}" for cls, count in classes]
    if r.without_gpus:
        parts.append(f"{r.without_gpus} without GPUs")
    total = sum(r.wrong_gpu_class.values()) + r.without_gpus
    return [f"{total} gpu_class is not {r.gpu_class_wanted} ({', '.join(parts)})"]


def _verb(count: int, singular: str, plural: str) -> str:
    return singular if count == 1 else plural


def _by_count(counts: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


@dataclass(slots=True)
class _Counted:
    """One profile's counts (``_count_examined``'s) and each examined node's part in them."""

    outcomes: dict[str, _Outcome]
    failures: Counter[tuple[Check, str]]
    fabric_sizes: Counter[str]
    without_fabric: int


class RejectionMemo:
    """The rejection counts of the round before, kept from round to round and recounted
    only at the nodes whose freshness, cordon or free room changed (``plan``'s ``carried``):
    a count is a sum over nodes of each node's first failing check, and a node whose inputs
    are the same gives the same check, so moving only the changed nodes' parts gives the
    very counts ``count_rejections`` gives. Starts over when the nodes' content may have
    changed (``version``: None, or another than the round before's).

    A round calls ``advance`` once, then ``count`` per profile; counts no round asked for
    are dropped at the next ``advance`` (their nodes' parts would be out of date).

    Pure: values only; the caller owns it."""

    def __init__(self) -> None:
        self.version: object = None
        self._fresh: frozenset[str] | None = None
        self._closed: frozenset[str] = frozenset()
        self._gpus: dict[str, int] = {}
        self._memory: dict[str, float | None] = {}
        self._by_class: dict[str | None, list[Node]] = {}
        self._nodes: dict[str, Node] = {}
        self._stale: Counter[str | None] = Counter()
        self._shut: Counter[str | None] = Counter()
        self._counted: dict[object, _Counted] = {}
        self._used: set[object] = set()
        self._changed: frozenset[str] = frozenset()
        self._total = 0
        # Counts recounted node by node rather than counted afresh (for tests and benchmarks).
        self.recounted = 0

    def advance(
        self,
        version: object,
        nodes: Sequence[Node],
        *,
        fresh: frozenset[str],
        closed: frozenset[str],
        gpus: dict[str, int],
        memory: dict[str, float | None],
    ) -> None:
        """Start a round: ``gpus`` and ``memory`` are every node's free room as counted
        (the memo keeps them; pass copies)."""
        if version is None or version != self.version or self._fresh is None:
            index = ClassIndex.of(nodes, fresh, closed)
            self._by_class = {k: list(v) for k, v in index.by_class.items()}
            self._stale, self._shut = Counter(index.stale), Counter(index.closed)
            self._counted = {}
            self._changed = frozenset()
            self._nodes = {n.name: n for n in nodes}
        else:
            self._counted = {k: v for k, v in self._counted.items() if k in self._used}
            turned = (fresh ^ self._fresh) | (closed ^ self._closed)
            moved = {k for k, _ in gpus.items() ^ self._gpus.items()}
            moved.update(k for k, _ in memory.items() ^ self._memory.items())
            for name in turned:
                gpu_class = self._nodes[name].gpu_class
                if name not in self._fresh:
                    self._stale[gpu_class] -= 1
                elif name in self._closed:
                    self._shut[gpu_class] -= 1
                if name not in fresh:
                    self._stale[gpu_class] += 1
                elif name in closed:
                    self._shut[gpu_class] += 1
            self._changed = frozenset(turned | moved)
        self.version, self._fresh, self._closed = version, fresh, closed
        self._gpus, self._memory = gpus, memory
        self._total = len(nodes)
        self._used = set()

    def count(
        self,
        key: object,
        profile: PlacementProfile,
        nodes: Sequence[Node],
        *,
        capacity: FreeCapacity,
        avoid: Collection[str] = (),
    ) -> ProfileRejections:
        """``count_rejections(profile, nodes, ...)`` with this round's ``advance``'s
        freshness and cordons; ``key`` names the profile, its requirement and ``avoid``."""
        fresh = self._fresh or frozenset()
        closed = self._closed
        examined: Sequence[Node] = (
            nodes if profile.gpu_class is None else self._by_class.get(profile.gpu_class, ())
        )
        counted = self._counted.get(key)
        if counted is None:
            counted = self._counted[key] = _Counted({}, Counter(), Counter(), 0)
            for node in examined:
                outcome = _outcome(profile, node, fresh, capacity, closed, avoid)
                counted.outcomes[node.name] = outcome
                _add(counted, outcome, 1)
        else:
            self.recounted += 1
            outcomes = counted.outcomes
            for name in self._changed:
                old = outcomes.get(name)
                if old is None:
                    continue
                new = _outcome(profile, self._nodes[name], fresh, capacity, closed, avoid)
                if new != old:
                    _add(counted, old, -1)
                    _add(counted, new, 1)
                    outcomes[name] = new
        self._used.add(key)
        failures: Counter[tuple[Check, str]] = Counter(counted.failures)
        if profile.gpu_class is not None:
            # Every node of another class fails at freshness, cordon or class (``ClassIndex``).
            for gpu_class, members in self._by_class.items():
                if gpu_class == profile.gpu_class:
                    continue
                stale, shut = self._stale.get(gpu_class, 0), self._shut.get(gpu_class, 0)
                failures[Check.STALE, ""] += stale
                failures[Check.CORDONED, ""] += shut
                if len(members) > stale + shut:
                    failures[Check.GPU_CLASS, gpu_class or ""] += len(members) - stale - shut
        return _assemble(
            profile, self._total, failures, counted.fabric_sizes, counted.without_fabric
        )


def _outcome(  # noqa: PLR0917
    profile: PlacementProfile,
    node: Node,
    fresh: Collection[str],
    capacity: FreeCapacity,
    closed: Collection[str],
    avoid: Collection[str],
) -> _Outcome:
    """One node's first failing check for ``profile`` (``_count_examined``'s chain)."""
    name, wanted, selector = node.name, profile.gpu_class, profile.node_selector
    if name not in fresh:
        return Check.STALE, ""
    if name in closed:
        return Check.CORDONED, ""
    if wanted is not None and node.gpu_class != wanted:
        return Check.GPU_CLASS, node.gpu_class or ""
    if selector and (label := missing_label(node.labels, selector)) is not None:
        return Check.LABELS, label
    if name in avoid:
        return Check.BACKOFF, ""
    if profile.gpus_per_node != 0 and capacity.free_gpus(name) < profile.gpus_per_node:
        return Check.FREE_GPUS, ""
    if not memory_fits(capacity.free_memory(name), profile.min_memory_gb):
        return Check.MEMORY, ""
    return None, node.fabric


def _add(counted: _Counted, outcome: _Outcome, n: int) -> None:
    check, detail = outcome
    if check is not None:
        counted.failures[check, cast(str, detail)] += n
    elif detail is None:
        counted.without_fabric += n
    else:
        counted.fabric_sizes[detail] += n
