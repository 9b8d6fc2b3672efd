"""Each model's summary over a sliding window, kept up to date batch by batch. Pure.

A decision round reads every model's summary of the last ``policy.window`` (a minute of
5 s windows from each gateway: 24,000 windows for 1,000 models and 2 gateways).
Summarising them all again every round was most of the round's cost; here windows are
folded into their model's running figures once, when they arrive, and out once, when
they leave the window, so a round only reads the figures.

Exactness is what the backtest needs (a replay with the policy that ran must make the
recorded decisions), and the daemon folds windows in as they arrive while a backtest,
or a daemon that just took over, folds a whole window at once. So every figure is a
function of the *set* of windows in the window, whatever the order and history of
folding:

- sums are of integers (counts; in-flight means in millionths times window lengths in
  microseconds), so adding and removing is exact in any order, and the one float
  division per gateway is of two integers (correctly rounded by Python);
- maxima (waiting, in-flight, replicas, the p99s of windows that served requests) are
  raised as figures come in; figures that leave holding a maximum mark it stale, and a
  stale maximum is taken again over what is live, with ``max``, when read. A maximum is
  one whatever the order.

Windows are folded a batch at a time (one ``add``: what the daemon read since its last
round), not one by one: each model's windows of a batch become one *chunk* (its sums
and maxima, taken in one pass with no object per window), and the model's running
figures take in and give back whole chunks, so what leaves costs a few operations per
model, not per window. Windows leave in the order they were received and batches hold
disjoint, increasing spans of receipt times, so a batch leaves whole once its newest
window is out of the window; one that straddles the edge (a round early) has each chunk
it keeps built again from its remaining windows, and a whole read is folded as several
batches (``WHOLE_READ_PIECES``) so that the edge moves through it a piece at a time.
Window by window (a tuple or two per window in, a pass per window out) folding one
interval at 1,000 models cost about 15-16 ms of CPU; by batch about 10
(docs/benchmarks/autoscaling.md).

``summarise`` (one model's windows at once) is this same code on one chunk.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable
from datetime import datetime, timedelta

from autoscale.windows import Summary, Window, sustained_queue_wait

MICRO = 1_000_000
ONE_US = timedelta(microseconds=1)
# A p99 not counted (None, or a window that served no request): below any real latency.
ABSENT = -1.0
FIELDS = ("waiting", "inflight_max", "replicas", "queue_wait_p99_s", "ttft_p99_s", "tpot_p99_s")
_FIELD_INDEXES = range(len(FIELDS))
# A whole window read at once (a daemon's first round, or one that refolds) is folded as
# this many batches: the edge of the window then moves through it piece by piece, and a
# round rebuilds at most one piece's windows rather than all those the read still holds.
WHOLE_READ_PIECES = 8


def _received(w: Window) -> datetime:
    return w.received_at


class _Chunk:
    """One model's windows of one batch, oldest first, and their sums and maxima."""

    __slots__ = ("errors", "first", "gateways", "last", "requests", "top", "windows")

    def __init__(self, windows: list[Window]) -> None:
        self.windows = windows
        self.first = windows[0].received_at
        self.last = windows[-1].received_at
        # One pass, everything in locals: the round's hot loop (columns taken with
        # builtins cost more than this for the few windows a model has in a batch).
        sums: dict[str, list[int]] = {}
        requests = errors = 0
        waiting = inflight_max = replicas = -1
        queue = ttft = tpot = ABSENT
        for w in windows:
            micro = round(w.inflight_mean * MICRO)
            us = (w.end - w.start) // ONE_US
            if us < 0:  # noqa: PLR1730 (a comparison costs less than a call, per window)
                us = 0
            # Per gateway: [sum of millionths x us, sum of us, sum of millionths, windows].
            acc = sums.get(w.gateway)
            if acc is None:
                sums[w.gateway] = [micro * us, us, micro, 1]
            else:
                acc[0] += micro * us
                acc[1] += us
                acc[2] += micro
                acc[3] += 1
            served = w.requests
            requests += served
            errors += w.errors
            v = w.waiting
            if v > waiting:  # noqa: PLR1730
                waiting = v
            v = w.inflight_max
            if v > inflight_max:  # noqa: PLR1730
                inflight_max = v
            v = w.replica_count
            if v > replicas:  # noqa: PLR1730
                replicas = v
            if served > 0:  # the p99s of a window that served nothing are not counted
                x = w.queue_wait_p99_s
                if x is not None and x > queue:
                    queue = x
                x = w.ttft_p99_s
                if x is not None and x > ttft:
                    ttft = x
                x = w.tpot_p99_s
                if x is not None and x > tpot:
                    tpot = x
        self.gateways = sums
        self.requests = requests
        self.errors = errors
        self.top = (waiting, inflight_max, replicas, queue, ttft, tpot)


class _Model:
    """One model's live chunks, oldest first, and their running figures."""

    __slots__ = (
        "chunks",
        "count",
        "errors",
        "gateways",
        "name",
        "requests",
        "stale",
        "top",
        "windows",
    )

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.chunks: deque[_Chunk] = deque()
        # Each maximum over the live chunks, how many chunks hold it, and which maxima no
        # live chunk holds any more (taken again from the chunks, with ``max``, only when
        # read). Most figures repeat from chunk to chunk (no request waits, the same
        # replicas), so the count keeps a chunk that leaves from making its maximum stale.
        self.top = [ABSENT] * len(FIELDS)
        self.count = [0] * len(FIELDS)
        self.stale: list[int] = []
        self.requests = 0
        self.errors = 0
        self.windows = 0
        # Per gateway: [sum of millionths x us, sum of us, sum of millionths, windows].
        self.gateways: dict[str, list[int]] = {}

    def add(self, c: _Chunk, *, front: bool = False) -> None:
        if front:
            self.chunks.appendleft(c)
        else:
            self.chunks.append(c)
        own = self.gateways
        for gateway, sums in c.gateways.items():
            acc = own.get(gateway)
            if acc is None:
                own[gateway] = sums.copy()
            else:
                acc[0] += sums[0]
                acc[1] += sums[1]
                acc[2] += sums[2]
                acc[3] += sums[3]
        self.requests += c.requests
        self.errors += c.errors
        self.windows += len(c.windows)
        vals, top, count = c.top, self.top, self.count
        for i in _FIELD_INDEXES:
            v = vals[i]
            m = top[i]
            if v > m:
                top[i] = v
                count[i] = 1
            elif v == m:
                count[i] += 1

    def drop_oldest(self) -> _Chunk:
        c = self.chunks.popleft()
        own = self.gateways
        for gateway, sums in c.gateways.items():
            acc = own[gateway]
            acc[0] -= sums[0]
            acc[1] -= sums[1]
            acc[2] -= sums[2]
            acc[3] -= sums[3]
            if acc[3] == 0:
                del own[gateway]
        self.requests -= c.requests
        self.errors -= c.errors
        self.windows -= len(c.windows)
        vals, top, count = c.top, self.top, self.count
        for i in _FIELD_INDEXES:
            if vals[i] == top[i]:
                count[i] -= 1
                if count[i] == 0:
                    self.stale.append(i)
        return c

    def summary(self) -> Summary:
        load = 0.0
        # Gateways' loads add; summed in name order so that the float sum is one sum.
        gateways = self.gateways
        for gateway in sorted(gateways) if len(gateways) > 1 else gateways:
            weighted, us, micro, n = gateways[gateway]
            load += weighted / (us * MICRO) if us > 0 else micro / (n * MICRO)
        top = self.top
        if self.stale:
            for i in self.stale:
                column = [c.top[i] for c in self.chunks]
                top[i] = m = max(column)
                self.count[i] = column.count(m)
            self.stale.clear()
        waiting, inflight_max, replicas, queue, ttft, tpot = top
        return Summary(
            self.windows,
            len(gateways),
            self.requests,
            self.errors,
            int(waiting),
            # Rounded so that a summary read back from its JSON decides the same.
            round(load, 6),
            int(inflight_max),
            int(replicas),
            None if queue == ABSENT else queue,
            None if ttft == ABSENT else ttft,
            None if tpot == ABSENT else tpot,
        )


class _Batch:
    """The chunks of one ``add``, and the span of receipt times they hold."""

    __slots__ = ("chunks", "first", "last")

    def __init__(self, first: datetime, last: datetime, chunks: list[tuple[_Model, _Chunk]]):
        self.first = first
        self.last = last
        self.chunks = chunks


class Rolling:
    """Every model's live windows: those received after ``after`` (``expire``), folded in
    oldest first (``add``). ``summary(model)`` is the model's ``Summary`` of them."""

    def __init__(self) -> None:
        self.models: dict[str, _Model] = {}
        # The batches, oldest first: expiry walks only what leaves.
        self._batches: deque[_Batch] = deque()
        self.after: datetime | None = None
        self.newest: datetime | None = None

    def windows(self) -> list[Window]:
        """The live windows, oldest first."""
        return sorted(
            (w for m in self.models.values() for c in m.chunks for w in c.windows), key=_received
        )

    @classmethod
    def of(cls, windows: Iterable[Window]) -> Rolling:
        """The windows read at once (a daemon's first round, a look at one model)."""
        rolling = cls()
        rolling.add(windows, pieces=WHOLE_READ_PIECES)
        return rolling

    def add(self, windows: Iterable[Window], *, pieces: int = 1) -> None:
        """Fold in ``windows`` (any order among themselves). One received before a window
        already held, or at or before ``after``, cannot be queued in order: the whole set
        is folded again, which gives the same figures (see the module). ``pieces``: fold
        them as up to that many batches of consecutive receipt times (see
        ``WHOLE_READ_PIECES``)."""
        fresh = sorted(windows, key=_received)
        if not fresh:
            return
        if self.after is not None and fresh[0].received_at <= self.after:
            fresh = [w for w in fresh if w.received_at > self.after]
            if not fresh:
                return
        if self.newest is not None and fresh[0].received_at < self.newest:
            fresh = sorted([*self.windows(), *fresh], key=_received)
            self.models, self._batches = {}, deque()
            pieces = WHOLE_READ_PIECES
        self.newest = fresh[-1].received_at
        for piece in _pieces(fresh, pieces):
            self._add_batch(piece)

    def _add_batch(self, fresh: list[Window]) -> None:
        by_model: dict[str, list[Window]] = {}
        for w in fresh:
            own = by_model.get(w.model)
            if own is None:
                by_model[w.model] = [w]
            else:
                own.append(w)
        models = self.models
        chunks = []
        for name, own in by_model.items():
            m = models.get(name)
            if m is None:
                m = models[name] = _Model(name)
            c = _Chunk(own)
            m.add(c)
            chunks.append((m, c))
        self._batches.append(_Batch(fresh[0].received_at, fresh[-1].received_at, chunks))

    def expire(self, after: datetime) -> None:
        """Fold out every window received at or before ``after``."""
        batches, models = self._batches, self.models
        while batches and batches[0].first <= after:
            batch = batches[0]
            if batch.last <= after:  # the whole batch leaves
                batches.popleft()
                for m, _ in batch.chunks:
                    m.drop_oldest()
                    if not m.chunks:
                        del models[m.name]
                continue
            # The batch straddles the edge: each chunk it holds is the oldest of its
            # model (every older batch left whole); the windows it keeps become a chunk.
            kept = []
            for m, c in batch.chunks:
                if c.first > after:
                    kept.append((m, c))
                    continue
                m.drop_oldest()
                cut = bisect.bisect_right(c.windows, after, key=_received)
                if cut < len(c.windows):
                    fresh = _Chunk(c.windows[cut:])
                    m.add(fresh, front=True)
                    kept.append((m, fresh))
                elif not m.chunks:
                    del models[m.name]
            batch.chunks = kept
            batch.first = min(c.first for _, c in kept)
            break
        if self.after is None or after > self.after:
            self.after = after

    def summary(self, model: str) -> Summary | None:
        """The model's summary; None when no live window is of it."""
        m = self.models.get(model)
        return None if m is None else m.summary()

    def sustained_queue_wait(self, model: str) -> float | None:
        """``windows.sustained_queue_wait`` of the model's live windows: a walk over them,
        taken only when a decision needs it (its queue wait p99 is above its threshold)."""
        m = self.models.get(model)
        if m is None:
            return None
        return sustained_queue_wait(w for c in m.chunks for w in c.windows)


def _pieces(ordered: list[Window], pieces: int) -> list[list[Window]]:
    """``ordered`` cut into up to ``pieces`` runs of about equal length, each cut between
    two different receipt times (batches must hold disjoint spans of them)."""
    if pieces <= 1 or len(ordered) < 2 * pieces:
        return [ordered]
    out, start = [], 0
    for k in range(1, pieces):
        cut = max(start, len(ordered) * k // pieces)
        # Move the cut past windows received at the same time as the one before it.
        cut = bisect.bisect_right(ordered, ordered[cut - 1].received_at, lo=cut, key=_received)
        if start < cut < len(ordered):
            out.append(ordered[start:cut])
            start = cut
    out.append(ordered[start:])
    return out


def summarise(windows: Iterable[Window]) -> Summary:
    """One model's windows (all of them inside the decision's window) as one summary."""
    ordered = sorted(windows, key=_received)
    if not ordered:
        return Summary()
    m = _Model()
    m.add(_Chunk(ordered))
    return m.summary()
