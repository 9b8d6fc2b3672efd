"""Work-conserving slots: a gateway may fill a slot another gateway's deal leaves idle.

Pure: the deal (gateway.stages.slotshare) and the engines' own counts in, the requests
this process may have in flight on each replica out (``State.dealt``, what the queue
stage counts against). The readings are taken off the request path
(gateway.engineload); a request never waits for one.

A deal alone is not work-conserving: a gateway with no traffic leaves its part of every
replica idle while another queues. So each gateway reads the engines' own counts of the
requests they are serving and holding back (gateway.engineload: ``/metrics``; llama.cpp's
``/slots`` without ``--metrics``, which counts only the slots busy, so that an engine whose
every slot is busy is taken to lend nothing) and subtracts its own: what is left is the
*others'* requests there. A replica's limit for this gateway is then its
deal, or, when the others' requests leave more, the replica's slots less the others'
requests: it may borrow the idle ones.

**The bound.** A slot is borrowed only when every reading over at least ``SPAN_S`` (two
at the least: readings come ``POLL_S`` apart while the gateway has requests for the
model, ``IDLE_POLL_S`` while not; the newest no older than ``FRESH_S``) showed it idle,
taking the largest of their counts of the others' requests: a slot idle for a moment
(its gateway refilling it from its own queue, or relaying the tail of an answer its
engine has finished, slowly on a loaded machine) is not lent.
A request this gateway sent while a reading was in flight counts as its own only if it
was in flight before and after. An engine runs more requests than
its slots only when another gateway's traffic rose after those readings: the excess is
at most the slots the borrowers took (each at most the slots its readings showed idle),
each excess request waits at the engine for at most one request's service time (the
borrowed request ends; none is taken back), and the borrowers take no new slot there
from their next reading on. Without readings (an engine that says nothing, or none
yet) the limit is the deal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.table import Replica

# Between two readings of a replica's engine while this gateway has requests for its
# model, and while it has none.
POLL_S = 0.1
IDLE_POLL_S = 1.0
# A reading older than this lends nothing.
FRESH_S = 2.5 * IDLE_POLL_S
# A slot is lent when the readings showed it idle over at least this long: longer than
# the moments another gateway's slot is idle between two of its requests (a loaded
# gateway relays an answer's tail after its engine has freed the slot), so that only a
# gateway with no traffic there lends.
SPAN_S = 1.0
# Readings kept a replica (enough to cover SPAN_S at POLL_S).
KEPT = 16


@dataclass(frozen=True, slots=True)
class Reading:
    """The other gateways' requests at a replica's engine, as one reading found them."""

    others: int
    at: float  # monotonic, when the answer came


def others(busy: int, mine_before: int, mine_after: int) -> int:
    """The other gateways' requests among ``busy`` (the engine's count): this process's
    own are those in flight both when the reading was sent and when it came back."""
    return max(0, busy - min(mine_before, mine_after))


def lend(
    deal: Mapping[str, int],
    replicas: Mapping[str, Replica],
    readings: Mapping[str, tuple[Reading, ...]],
    now: float,
) -> dict[str, int]:
    """Replica key -> the requests this process may have in flight there: its deal, or
    more where the readings (``readings``: the last ``KEPT``, oldest first) left slots
    idle over ``SPAN_S`` (the module's bound)."""
    out = dict(deal)
    for key, taken in readings.items():
        mine = deal.get(key)
        r = replicas.get(key)
        if mine is None or r is None or len(taken) < 2 or now - taken[-1].at > FRESH_S:
            continue
        start = taken[-1].at - SPAN_S
        if taken[0].at > start:
            continue  # (not read over the whole span yet)
        busiest = 0
        for i, reading in enumerate(taken):
            # The readings within the span, and the last one before it (in force at its
            # start).
            if reading.at >= start or (i + 1 < len(taken) and taken[i + 1].at > start):
                busiest = max(busiest, reading.others)
        limit = r.slots - busiest
        if limit > mine:
            out[key] = limit
    return out
