"""A queue per model, for when every ready replica is full: who waits, who goes first.

Pure: the waiters, their order and their bounds, as data; the proxy (the edge) holds a
waiter's future, wakes it and counts what it has in flight. A replica is *full* when the
gateway's requests in flight there reach its share of the replica's slots (``budget``:
the engine's slots, ``Replica.slots``, times ``[gateway] slot_share``); a replica whose
slots are not known is never full, so a model without them never queues.

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
the place of the newest of the lowest class, which is refused ``queue_full``), each for at
most ``max_wait_s`` (or the client's own shorter timeout): then ``queue_timeout``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from catalog.forms.priority import PRIORITY_CLASSES, STANDARD
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


def budget(slots: int, share: float) -> int:
    """Requests this gateway may have in flight on a replica of ``slots`` slots (at least
    one, so a gateway with a small share is never locked out)."""
    return max(1, int(slots * share))


def open_replicas(
    replicas: Iterable[Replica], loads: Mapping[str, Load], share: float
) -> list[Replica]:
    """The replicas with a free slot, or whose slots are not known (on every request to a
    model with slots: ``budget`` inlined, a call per replica was half its cost)."""
    out = []
    for r in replicas:
        slots = r.slots
        if slots <= 0:
            out.append(r)
            continue
        load = loads.get(r.key)
        if load is None or load.inflight < max(1, int(slots * share)):
            out.append(r)
    return out


def free_slots(replicas: Iterable[Replica], loads: Mapping[str, Load], share: float) -> float:
    """Free slots among ``replicas`` (infinite when one's slots are not known)."""
    free = 0.0
    for r in replicas:
        if r.slots <= 0:
            return math.inf
        free += max(0, budget(r.slots, share) - loads.get(r.key, _IDLE).inflight)
    return free


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
    _seq: int = 0

    def push(self, w: Waiter, *, front: bool = False) -> tuple[bool, Waiter | None]:
        """Queue ``w``: (queued, the waiter it displaced). Not queued when the queue is
        full of waiters of its class or above."""
        evicted = None
        if self.length >= self.bounds.max_length:
            evicted = self._newest_below(w.klass)
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
        return True, evicted

    def _waits(self, client: str) -> bool:
        return any(client in per_client for per_client in self.waiting.values())

    def _newest_below(self, klass: str) -> Waiter | None:
        for lower in reversed(CLASSES[RANK[klass] + 1 :]):
            lines = self.waiting[lower]
            if lines:
                return max((line[-1] for line in lines.values()), key=lambda w: w.seq)
        return None

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
        return True

    def pop(self, now: float) -> Waiter | None:
        """The waiter that goes next (the module's order), charged its guess."""
        if not self.length:
            return None
        w = self._starved(now) or self._fair()
        self.remove(w)
        guess = self.per_request.get(w.client, FIRST_GUESS)
        start = self.vt.get(w.client, self.clock)
        self.clock = max(self.clock, start)
        self.vt[w.client] = start + guess / w.share
        w.charged = guess
        return w

    def _starved(self, now: float) -> Waiter | None:
        oldest: Waiter | None = None
        for lines in self.waiting.values():
            for line in lines.values():
                head = line[0]
                if now - head.enqueued >= self.bounds.starvation_s and (
                    oldest is None or head.seq < oldest.seq
                ):
                    oldest = head
        return oldest

    def _fair(self) -> Waiter:
        for klass in CLASSES:
            lines = self.waiting[klass]
            if lines:
                vt, clock = self.vt, self.clock
                client = min(lines, key=lambda c: (vt.get(c, clock), lines[c][0].seq))
                return lines[client][0]
        raise LookupError("pop from an empty queue")  # length said otherwise: a bug

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
