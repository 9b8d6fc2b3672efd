"""This gateway process's part of each replica's slots, dealt among the live gateways.

Pure: the table's ready replicas and the gateways alive in front of them in, the slots
this process may fill on each replica (its *deal*) out; the queue stage
(gateway.stages.queue) counts its requests in flight against it. Made when a table is
installed or the gateways change (``State.deal``), never on a request.

**Who is live.** Every gateway process posts its signal windows to the control plane
every ``signals_interval`` (5 s); the answer lists every gateway (a token's name and a
worker number, ``autoscale.signals.identity``) that posted within
``autoscale.signals.LIVE_S`` (15 s), sorted, and names the poster. So each process knows
how many there are (``Members.count``) and its own place among them (``index``), and all
of them deal alike. Until the first answer (and with no control plane to answer) a
process counts its own gateway's workers only.

**The deal.** A model's slots are units in a row: its ready replicas in key order, each
replica's ``slots`` units, the row started at a place of the model's own
(``stable_hash(model) % count``, so that one gateway is not dealt the first unit of every
model). Unit ``j`` goes to the gateway of index ``j % count``. So every gateway gets
``slots // count`` of each replica or one more, the remainders go round the gateways
instead of all to the same one, and the deals of all the gateways add up to the
replica's slots exactly: two gateways in front of two 1-slot replicas take one replica
each (a share of 0.5 took both, oversubscribing each 2x), and in front of two 3-slot
replicas 2+1 and 1+2 (a share of 0.5 left one slot of each idle).

A gateway dealt no unit of a model at all (more gateways than the model has slots) is
dealt one slot of one replica anyway (by its index), or it could never serve the model:
then, and only then, the gateways together may send a replica more than its slots, at
most one request more per such gateway, and its engine queues the excess.

``slot_share`` set (``[gateway] slot_share``, ``--slot-share``): the operator's fixed
fraction instead, as before: ``slots x slot_share / workers``, at least 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.table import Replica, stable_hash

# The most gateway processes an answer's list is taken from (64 workers of 64 gateways).
MAX_MEMBERS = 4096


@dataclass(frozen=True, slots=True)
class Members:
    """The gateway processes in front of the replicas, and this one's place among them."""

    count: int = 1
    index: int = 0

    def view(self) -> dict[str, int]:
        return {"count": self.count, "index": self.index}


def members_of(gateways: object, me: object) -> Members | None:
    """From the control plane's answer to a post: its ``gateways`` (the live ones, sorted)
    and ``gateway`` (who posted). None when it says no such thing (a control plane
    before this, or an answer out of shape): the members known stay."""
    if not isinstance(me, str) or not isinstance(gateways, list):
        return None
    if len(gateways) > MAX_MEMBERS or not all(isinstance(g, str) for g in gateways):
        return None
    live = sorted({*gateways, me})
    return Members(len(live), live.index(me))


def _units(lo: int, hi: int, index: int, count: int) -> int:
    """How many ``j`` in ``[lo, hi)`` have ``j % count == index``."""
    return (hi - 1 - index) // count - (lo - 1 - index) // count


def deal(
    ready: Mapping[str, Sequence[Replica]],
    members: Members,
    share: float | None = None,
    workers: int = 1,
) -> dict[str, int]:
    """Replica key -> the requests this process may have in flight there, for every ready
    replica whose slots are known (the others are never full); ``share``: the fixed
    fraction of ``[gateway] slot_share``, split among ``workers``."""
    out: dict[str, int] = {}
    if share is not None:
        part = share / max(workers, 1)
        for replicas in ready.values():
            for r in replicas:
                if r.slots > 0:
                    out[r.key] = max(1, int(r.slots * part))
        return out
    count = max(members.count, 1)
    index = members.index % count
    for model, replicas in ready.items():
        slotted = [r for r in replicas if r.slots > 0]
        if not slotted:
            continue
        at = stable_hash(model) % count
        total = 0
        for r in slotted:
            mine = _units(at, at + r.slots, index, count)
            out[r.key] = mine
            total += mine
            at += r.slots
        if not total:  # more gateways than slots: one anyway (the module's docstring)
            out[slotted[index % len(slotted)].key] = 1
    return out
