"""A queue per model, for when every ready replica is full: who waits, who goes first.

Pure: the waiters, their order and their bounds, as data; the proxy (the edge) holds a
waiter's future, wakes it and counts what it has in flight. A replica is *full* when the
gateway's requests in flight there reach its deal of the replica's slots (the engine's
slots, ``Replica.slots``, dealt among the live gateways: gateway.stages.slotshare); a
replica whose slots are not known is never full, so a model without them never queues.

The order, as ``docs/operator/gateway.md`` states it:

1. A waiter of any class that has waited ``starvation_s`` or longer goes first, the
   oldest of them first: a ``batch`` request is served at the latest that long after it
   came, whatever keeps arriving above it (no starvation).
2. Else the highest class with a waiter (``critical`` before ``standard`` before
   ``batch``).
3. Within the class, the client with the least service per unit of share: weighted fair
   queuing over *tokens served*. Each client of the model carries a virtual time (the
   tokens its requests were served, divided by its share); a request leaving the queue is
   charged its client's running average of tokens a request, and corrected by the real
   count when it completes, so a client of long answers is charged for them. A client
   that starts waiting starts at the virtual time of the last request served (``clock``):
   an idle while earns no credit to flood with later. Ties go to the oldest request.
4. Within a client, first come first served.

Bounded: at most ``max_length`` waiters a model (a newcomer that outranks a waiter takes
the place of the newest of the lowest class, which is refused ``queue_full``; else, within
its class, the place of the newest waiter of the client with the most waiters, when that
client has at least two more than the newcomer's: one client's flood does not shut the
others out), each for at most ``max_wait_s`` (or the client's own shorter timeout): then
``queue_timeout``.

**Waiting for one replica** (a *hold*). A request whose routing profile chose a replica
for what that replica holds (``Choice.sticky``: the replica holding the prompt's
conversation under ``prefix``, a session key's replica under ``session``) and found it
full waits for *that* replica's slot, not the first slot freed anywhere, which would send
it to an engine without its prefix (issue 41). It holds only within the prefix profile's
balance bound (``holdable``: the replica's in-flight requests plus the waiters already
holding for it, per unit of weight, at most ``BALANCE`` above the least loaded replica's),
so a hot prefix spills; and only for ``hold_s`` (at most ``starvation_s``): then it takes
the first free slot, as any other waiter (``release``). While it holds, the order above
is unchanged among the waiters a freed slot can serve: a slot freed on replica A goes to
the first of them by that order, holders of A and free waiters alike; a holder of A is
passed over for B's slot (and its client's later requests are not held behind it). A
holder granted its replica's slot has it reserved (``reserved``) until it takes it, so a
free waiter woken meanwhile does not take it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from catalog.forms.priority import PRIORITY_CLASSES, STANDARD
from gateway.stages.prefix import BALANCE
from gateway.stages.routing import Load
from gateway.table import Replica

CLASSES = PRIORITY_CLASSES
RANK = {name: i for i, name in enumerate(CLASSES)}
# What a request that has never completed is charged when it leaves the queue (tokens):
# about a short chat turn; corrected when it completes.
FIRST_GUESS = 64.0
# The weight of a completed request in its client's running average of tokens.
ALPHA = 0.2
# Clients named in GET /routing per model queue (the longest first).
SHOWN_CLIENTS = 20
_IDLE = Load()


@dataclass(frozen=True, slots=True)
class Bounds:
    """The queue's limits (``[gateway] queue_*``)."""

    max_length: int = 1024
    max_wait_s: float = 60.0
    starvation_s: float = 30.0


def open_replicas(
    replicas: Iterable[Replica], loads: Mapping[str, Load], dealt: Mapping[str, int]
) -> list[Replica]:
    """The replicas with a free slot of this gateway's deal (``dealt``: replica key -> the
    requests it may have in flight there, gateway.stages.slotshare), or whose slots are
    not known (not in ``dealt``). On every request to a model with slots: inlined."""
    out = []
    for r in replicas:
        mine = dealt.get(r.key)
        if mine is None:
            out.append(r)
            continue
        load = loads.get(r.key)
        if load is None or load.inflight < mine:
            out.append(r)
    return out


def is_open(r: Replica, loads: Mapping[str, Load], dealt: Mapping[str, int]) -> bool:
    """Whether ``r`` has a free slot of this gateway's deal (or its slots are not known)."""
    mine = dealt.get(r.key)
    if mine is None:
        return True
    load = loads.get(r.key)
    return load is None or load.inflight < mine


def unreserved(
    replicas: Iterable[Replica],
    loads: Mapping[str, Load],
    dealt: Mapping[str, int],
    reserved: Mapping[str, int],
) -> list[Replica]:
    """The replicas with a free slot not reserved for a holder (or slots not known)."""
    return [
        r
        for r in replicas
        if (mine := dealt.get(r.key)) is None
        or loads.get(r.key, _IDLE).inflight + reserved.get(r.key, 0) < mine
    ]


def free_slots(
    replicas: Iterable[Replica], loads: Mapping[str, Load], dealt: Mapping[str, int]
) -> float:
    """Free slots among ``replicas`` (infinite when one's slots are not known)."""
    free = 0.0
    for r in replicas:
        mine = dealt.get(r.key)
        if mine is None:
            return math.inf
        free += max(0, mine - loads.get(r.key, _IDLE).inflight)
    return free


def holdable(
    key: str,
    replicas: Iterable[Replica],
    loads: Mapping[str, Load],
    holding: Mapping[str, int],
    bound: float = BALANCE,
) -> bool:
    """Whether a request may wait for replica ``key``'s slot: its in-flight requests plus
    the waiters holding for it (per unit of weight) are at most ``bound`` above the least
    loaded replica's (the prefix profile's balance rule, with the holders counted as the
    in-flight requests they will be)."""
    mine = math.inf
    least = math.inf
    for r in replicas:
        load = (loads.get(r.key, _IDLE).inflight + holding.get(r.key, 0)) / r.weight
        least = min(least, load)
        if r.key == key:
            mine = load
    return mine - least <= bound


def rooms(
    replicas: Iterable[Replica],
    loads: Mapping[str, Load],
    dealt: Mapping[str, int],
    reserved: Mapping[str, int],
) -> dict[str, float]:
    """Per replica, its free slots not reserved for a holder (infinite when its slots
    are not known)."""
    out: dict[str, float] = {}
    for r in replicas:
        mine = dealt.get(r.key)
        if mine is None:
            out[r.key] = math.inf
        else:
            inflight = loads.get(r.key, _IDLE).inflight
            out[r.key] = max(0, mine - inflight - reserved.get(r.key, 0))
    return out


def servable(w: Waiter, now: float, room: Mapping[str, float]) -> bool:
    """Whether a free slot can serve ``w`` now: it holds for nothing, its hold is over,
    its replica left (not in ``room``), or its replica has room."""
    prefer = w.prefer
    return prefer is None or now >= w.hold_until or room.get(prefer, 1) > 0


def _first(line: Iterable[Waiter], now: float, room: Mapping[str, float]) -> Waiter | None:
    for w in line:
        if servable(w, now, room):
            return w
    return None


def lowered(own: str, asked: str | None) -> str:
    """The class a request runs in: its token's, or a lower one it asks for
    (``x-llmgw-priority-class``); a higher or unknown one is ignored, never granted."""
    if asked is None or asked not in RANK:
        return own
    return asked if RANK[asked] > RANK.get(own, RANK[STANDARD]) else own


@dataclass(eq=False, slots=True)
class Waiter:
    """One request in a model's queue."""

    client: str
    klass: str
    share: float
    enqueued: float  # monotonic
    deadline: float  # monotonic: then queue_timeout
    seq: int = 0
    charged: float = 0.0  # tokens charged when it left the queue
    ticket: Any = None  # the edge's (the proxy's future)
    # The replica it holds for (module docstring), and until when (monotonic).
    prefer: str | None = None
    hold_until: float = 0.0
    # The replica whose slot it was granted, reserved until it takes it (None: any).
    slot: str | None = None


@dataclass(slots=True)
class Holds:
    """One replica's holds, for ``GET /routing``."""

    holding: int = 0  # waiting for its slot now
    waited: int = 0  # held and were granted its slot
    expired: int = 0  # held until ``hold_s`` (or it left), then took any slot
    spilled: int = 0  # chose it, full, but past the balance bound: took any slot

    def view(self) -> dict[str, int]:
        return {
            "holding": self.holding,
            "waited": self.waited,
            "expired": self.expired,
            "spilled": self.spilled,
        }


@dataclass(slots=True)
class ModelQueue:
    """One model's waiters, and its clients' service so far."""

    model: str
    bounds: Bounds = field(default_factory=Bounds)
    # class -> client -> that client's waiters, oldest first
    waiting: dict[str, dict[str, deque[Waiter]]] = field(
        default_factory=lambda: {c: {} for c in CLASSES}
    )
    length: int = 0
    # client -> tokens served / share (virtual time); client -> tokens a request (EWMA)
    vt: dict[str, float] = field(default_factory=dict)
    per_request: dict[str, float] = field(default_factory=dict)
    clock: float = 0.0
    # Waiters woken for a free slot that have not taken it yet: a newcomer must not.
    granted: int = 0
    # replica -> slots granted to its holders and not taken yet (part of ``granted``).
    reserved: dict[str, int] = field(default_factory=dict)
    # replica -> its holds (the waiters holding for it now, and counts).
    holds: dict[str, Holds] = field(default_factory=dict)
    _seq: int = 0

    def holding(self) -> dict[str, int]:
        """Per replica, the waiters holding for it now."""
        return {k: h.holding for k, h in self.holds.items() if h.holding}

    def spilled(self, replica: str) -> None:
        """A request chose ``replica``, found it full and past the balance bound."""
        self._holds(replica).spilled += 1

    def _holds(self, replica: str) -> Holds:
        found = self.holds.get(replica)
        if found is None:
            found = self.holds[replica] = Holds()
        return found

    def release(self, w: Waiter) -> bool:
        """``w``'s hold is over (``hold_s`` passed, or its replica left): from now on it
        takes any slot. False when it held for nothing."""
        if w.prefer is None:
            return False
        h = self._holds(w.prefer)
        h.holding -= 1
        h.expired += 1
        w.prefer = None
        return True

    def taken(self, w: Waiter) -> None:
        """``w``, granted a slot, took it (or left without it): it is no longer promised."""
        self.granted -= 1
        if w.slot is not None:
            left = self.reserved.get(w.slot, 0) - 1
            if left > 0:
                self.reserved[w.slot] = left
            else:
                self.reserved.pop(w.slot, None)
            w.slot = None

    def retain(self, live: set[str]) -> None:
        """Forget the holds of replicas gone that nobody holds for."""
        for key in [k for k, h in self.holds.items() if k not in live and not h.holding]:
            del self.holds[key]

    def push(self, w: Waiter, *, front: bool = False) -> tuple[bool, Waiter | None]:
        """Queue ``w``: (queued, the waiter it displaced). Not queued when the queue is
        full of waiters of its class or above."""
        evicted = None
        if self.length >= self.bounds.max_length:
            evicted = self._newest_below(w.klass) or self._newest_of_most(w)
            if evicted is None:
                return False, None
            self.remove(evicted)
        self._seq += 1
        w.seq = w.seq or self._seq
        if not self._waits(w.client):
            # Back from idle: no credit for the while it did not ask.
            self.vt[w.client] = max(self.vt.get(w.client, 0.0), self.clock)
        per_client = self.waiting[w.klass]
        line = per_client.get(w.client)
        if line is None:
            line = per_client[w.client] = deque()
        if front:
            line.appendleft(w)
        else:
            line.append(w)
        self.length += 1
        if w.prefer is not None:
            self._holds(w.prefer).holding += 1
        return True, evicted

    def _waits(self, client: str) -> bool:
        return any(client in per_client for per_client in self.waiting.values())

    def _newest_below(self, klass: str) -> Waiter | None:
        for lower in reversed(CLASSES[RANK[klass] + 1 :]):
            lines = self.waiting[lower]
            if lines:
                return max((line[-1] for line in lines.values()), key=lambda w: w.seq)
        return None

    def _newest_of_most(self, w: Waiter) -> Waiter | None:
        """Of ``w``'s class, the newest waiter of the client with the most waiters, when
        that is at least two more than ``w``'s client has (after the swap it still has
        as many as ``w``'s). Without it one client's flood of requests filled the queue
        and every other client of its class was refused ``queue_full`` at once, though
        the fair order would serve it next. (Only when the queue is full: one pass over
        the class's clients.)"""
        lines = self.waiting[w.klass]
        if not lines:
            return None
        most = max(lines.values(), key=len)
        own = lines.get(w.client)
        if len(most) < (len(own) if own is not None else 0) + 2:
            return None
        return most[-1]

    def remove(self, w: Waiter) -> bool:
        """Take ``w`` out (it timed out or went away); False when it was not in."""
        lines = self.waiting[w.klass]
        line = lines.get(w.client)
        if line is None:
            return False
        try:
            line.remove(w)
        except ValueError:
            return False
        if not line:
            del lines[w.client]
        self.length -= 1
        if w.prefer is not None:
            self._holds(w.prefer).holding -= 1
        return True

    def pop(self, now: float, room: dict[str, float] | None = None) -> Waiter | None:
        """The waiter that goes next (the module's order), charged its guess.

        ``room``: per ready replica, its free slots not reserved (``rooms``), when some
        waiter holds for a replica: the next waiter a free slot can serve (a holder only
        when its replica has room, or once its hold is over); the holder granted its
        replica's slot has it reserved (``slot``), and ``room`` is updated. None when
        no waiter can be served now."""
        if not self.length:
            return None
        found = self._starved(now, room) or self._fair(now, room)
        if found is None:
            if room is None:
                raise LookupError("pop from an empty queue")  # length said otherwise: a bug
            return None
        w = found
        self.remove(w)
        if w.prefer is not None:
            h = self._holds(w.prefer)
            if room is not None and room.get(w.prefer, 0) > 0 and now < w.hold_until:
                h.waited += 1
                w.slot = w.prefer
                room[w.prefer] -= 1
                self.reserved[w.prefer] = self.reserved.get(w.prefer, 0) + 1
            else:  # its hold is over, or its replica left: any slot
                h.expired += 1
            w.prefer = None
        guess = self.per_request.get(w.client, FIRST_GUESS)
        start = self.vt.get(w.client, self.clock)
        self.clock = max(self.clock, start)
        self.vt[w.client] = start + guess / w.share
        w.charged = guess
        return w

    def _starved(self, now: float, room: dict[str, float] | None = None) -> Waiter | None:
        # (A waiter's hold ends by starvation_s, so a starved waiter is always served.)
        oldest: Waiter | None = None
        for lines in self.waiting.values():
            for line in lines.values():
                head = line[0] if room is None else _first(line, now, room)
                if (
                    head is not None
                    and now - head.enqueued >= self.bounds.starvation_s
                    and (oldest is None or head.seq < oldest.seq)
                ):
                    oldest = head
        return oldest

    def _fair(self, now: float, room: dict[str, float] | None) -> Waiter | None:
        for klass in CLASSES:
            lines = self.waiting[klass]
            if not lines:
                continue
            vt, clock = self.vt, self.clock
            if room is None:
                client = min(lines, key=lambda c: (vt.get(c, clock), lines[c][0].seq))
                return lines[client][0]
            # Each client's first waiter a free slot can serve (a holder of a full
            # replica is passed over, not its client's later requests).
            heads = [(c, w) for c, line in lines.items() if (w := _first(line, now, room))]
            if heads:
                return min(heads, key=lambda cw: (vt.get(cw[0], clock), cw[1].seq))[1]
        return None  # (with room: only holders of full replicas wait)

    def served(self, w: Waiter, tokens: int | None) -> None:
        """``w``'s request completed with ``tokens`` (prompt and completion; None: not
        known, the guess stands): its client's virtual time corrected."""
        if tokens is None or tokens < 0:
            return
        if w.client in self.vt:
            self.vt[w.client] += (tokens - w.charged) / w.share
        before = self.per_request.get(w.client, FIRST_GUESS)
        self.per_request[w.client] = before + ALPHA * (tokens - before)

    def forget_idle(self) -> None:
        """Drop the service of clients not waiting and not ahead of the clock (they would
        restart at the clock anyway): the maps stay as large as the clients waiting."""
        for client in [c for c, t in self.vt.items() if t <= self.clock and not self._waits(c)]:
            del self.vt[client]
            self.per_request.pop(client, None)

    def snapshot(self, now: float) -> dict[str, Any]:
        """``GET /routing``'s ``queue`` of the model: length, oldest wait, per class and
        per client (the ``SHOWN_CLIENTS`` longest lines)."""
        classes: dict[str, Any] = {}
        clients: dict[str, dict[str, Any]] = {}
        oldest_all = 0.0
        for klass, lines in self.waiting.items():
            n, oldest = 0, 0.0
            for client, line in lines.items():
                age = now - line[0].enqueued
                n += len(line)
                oldest = max(oldest, age)
                entry = clients.setdefault(client, {"length": 0, "oldest_wait_s": 0.0})
                entry["length"] += len(line)
                entry["oldest_wait_s"] = round(max(entry["oldest_wait_s"], age), 3)
            classes[klass] = {"length": n, "oldest_wait_s": round(oldest, 3)}
            oldest_all = max(oldest_all, oldest)
        shown = sorted(clients.items(), key=lambda kv: -kv[1]["length"])[:SHOWN_CLIENTS]
        return {
            "length": self.length,
            "oldest_wait_s": round(oldest_all, 3),
            "classes": classes,
            "clients": dict(shown),
        }

    def oldest_wait(self, klass: str, now: float) -> float:
        lines = self.waiting[klass]
        return max((now - line[0].enqueued for line in lines.values()), default=0.0)
