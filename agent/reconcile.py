"""What to start and stop so that the node runs what the scheduler placed on it. Pure.

The scheduler assigns a replica a *number* of cards on a node, not which
ones: the agent picks them here, the lowest free indices first, so the same
engines and placements always give the same cards, and a card is never given
to two engines. Stops are decided before starts, so the cards of an engine
being replaced are free for its successor in the same tick.

A replica spanning nodes runs an engine on each of them; a worker starts
once its head has reported where it listens (the head's agent reports that
while the head still waits for its workers).

An engine that exited is not restarted at once: the control plane learns it
failed and may place the replica elsewhere. While the replica stays placed
here it is restarted after a back-off that doubles with each failure, the
way a supervisor keeps a crashing program from spinning, unless the control
plane itself marks the replica failed: then it is the control plane's move.

An engine the agent ran through a time away from the control plane (an outage, a
partition, the agent itself stopped) may be *held*: not stopped for being no longer
placed, for a bounded grace after the agent is back. The control plane may have given
its node up meanwhile and unplaced it; the round after the agent's return places it
again where it runs, and an engine kept is an engine not restarted.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from agent.placements import Key, Want


@dataclass(frozen=True, slots=True)
class Have:
    """An engine this agent started (or adopted), alive or not."""

    key: Key
    fingerprint: str
    devices: tuple[int, ...]
    alive: bool
    # Wall-clock time the engine was seen to have exited (None while alive).
    exited_at: float | None = None
    restarts: int = 0
    # The model version it was started for ("" if not known).
    version: str = ""


@dataclass(frozen=True, slots=True)
class Start:
    want: Want
    devices: tuple[int, ...]
    restarts: int = 0


@dataclass(frozen=True, slots=True)
class Stop:
    key: Key
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    """A replica that cannot start now; reported as ``starting`` with the message."""

    key: Key
    message: str


@dataclass(frozen=True, slots=True)
class Backoff:
    first_s: float = 10.0
    max_s: float = 300.0

    def delay(self, restarts: int) -> float:
        return float(min(self.first_s * 2.0 ** min(restarts, 30), self.max_s))


@dataclass(frozen=True, slots=True)
class Decision:
    stops: tuple[Stop, ...] = ()
    starts: tuple[Start, ...] = ()
    waits: tuple[Wait, ...] = ()
    # Engines no longer placed here but held (see the module): kept running, their cards kept.
    held: tuple[Key, ...] = ()


def _changed(placed: Want, held: Have) -> str:
    """Why an engine whose slot now holds something else is stopped.

    A control plane that pins versions never changes what a placement runs: the
    slot was given to a new replica (its old one was removed, and this agent saw
    both at once), or a worker's head moved. Only a server from before versions
    changes the definition under a running replica.
    """
    if placed.version and held.version and placed.version != held.version:
        return (
            f"its slot now holds a new replica (version {placed.version[:12]}, was "
            f"{held.version[:12]}): stopped for it"
        )
    if placed.worker and placed.version and placed.version == held.version:
        return "its head moved: started again against the new head"
    return "its profile changed (a control plane without pinned versions): restarting"


def decide(
    wants: Iterable[Want],
    haves: Iterable[Have],
    devices: Sequence[int],
    now: float,
    backoff: Backoff = Backoff(),
    *,
    hold: Collection[Key] = frozenset(),
) -> Decision:
    """``hold``: engines not stopped for being no longer placed (see the module)."""
    wanted = {w.key: w for w in wants}
    held = {h.key: h for h in haves}
    stops: list[Stop] = []
    kept: list[Key] = []
    for key in sorted(held):
        placed = wanted.get(key)
        if placed is None and key in hold and held[key].alive:
            kept.append(key)
        elif placed is None:
            stops.append(Stop(key, "no longer placed on this node"))
        elif placed.launch is not None and placed.fingerprint != held[key].fingerprint:
            stops.append(Stop(key, _changed(placed, held[key])))
    stopped = {s.key for s in stops}
    in_use = {d for h in held.values() if h.alive and h.key not in stopped for d in h.devices}
    starts: list[Start] = []
    waits: list[Wait] = []
    for key in sorted(wanted):
        want = wanted[key]
        have = held.get(key) if key not in stopped else None
        if want.launch is None:
            continue  # its model left the catalog; it is about to be removed
        if want.worker and want.head_endpoint is None:
            waits.append(
                Wait(
                    key,
                    f"waiting for node {want.head}, the head of this {want.nnodes}-node "
                    "replica, to report where it listens",
                )
            )
            continue
        restarts = 0
        if have is not None:
            if have.alive:
                continue
            if want.server_state == "failed":
                continue  # the control plane knows; it places the replica again
            ready_at = (have.exited_at or now) + backoff.delay(have.restarts)
            if now < ready_at:
                continue
            restarts = have.restarts + 1
        free = [d for d in devices if d not in in_use]
        if len(free) < want.gpus:
            waits.append(
                Wait(
                    key,
                    f"waiting for {want.gpus} free GPU(s): {len(free)} of the node's "
                    f"{len(devices)} are free",
                )
            )
            continue
        given = tuple(free[: want.gpus])
        in_use.update(given)
        starts.append(Start(want, given, restarts))
    return Decision(tuple(stops), tuple(starts), tuple(waits), tuple(kept))
