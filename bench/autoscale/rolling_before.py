"""``autoscale.rolling`` as it was before batch folding (window by window), kept only so that
``python -m bench autoscale`` measures the two in the same run. Not used by the product.

Each model's summary over a sliding window, kept up to date window by window. Pure.

A decision round reads every model's summary of the last ``policy.window`` (a minute of
5 s windows from each gateway: 24,000 windows for 1,000 models and 2 gateways).
Summarising them all again every round was most of the round's cost; here each window
is folded into its model's running figures once, when it arrives, and out once, when it
leaves the window, so a round only reads the figures.

Exactness is what the backtest needs (a replay with the policy that ran must make the
recorded decisions), and the daemon folds windows in as they arrive while a backtest,
or a daemon that just took over, folds a whole window at once. So every figure is a
function of the *set* of windows in the window, whatever the order and history of
folding:

- sums are of integers (counts; in-flight means in millionths times window lengths in
  microseconds), so adding and removing is exact in any order, and the one float
  division per gateway is of two integers (correctly rounded by Python);
- maxima (waiting, in-flight, replicas, the p99s of windows that served requests) are
  raised as windows come in; a window that leaves holding a maximum marks it stale, and
  a stale maximum is taken again over the model's live windows with ``max`` when read.
  A maximum is one whatever the order. Windows leave in the order they were received,
  so each model's live windows are a queue: in at the back, out at the front.

``summarise`` (one model's windows at once) is this same code on a fresh fold.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from datetime import datetime, timedelta

from autoscale.windows import Summary, Window

MICRO = 1_000_000
ONE_US = timedelta(microseconds=1)
# A p99 not counted (None, or a window that served no request): below any real latency.
ABSENT = -1.0
FIELDS = ("waiting", "inflight_max", "replicas", "queue_wait_p99_s", "ttft_p99_s", "tpot_p99_s")
_FIELD_INDEXES = range(len(FIELDS))


class _Model:
    """One model's live windows and their running figures."""

    __slots__ = (
        "count",
        "errors",
        "gateways",
        "name",
        "requests",
        "rows",
        "stale",
        "top",
        "values",
    )

    def __init__(self, name: str = "") -> None:
        self.name = name
        # Per live window, oldest first: (window, gateway, millionths x us, us, millionths).
        self.rows: deque[tuple[Window, str, int, int, int]] = deque()
        # The maxima's operands (waiting, inflight_max, replicas, then the queue-wait,
        # TTFT and TPOT p99s), one per live window in the order of ``rows``; each
        # maximum, how many live windows hold it, and which maxima no live window holds
        # any more (taken again from the operands, with ``max``, only when read). Most
        # figures repeat from window to window (no request waits, the same replicas), so
        # the count keeps a window that leaves from making its maximum stale.
        self.values: deque[tuple[float, ...]] = deque()
        self.top = [ABSENT] * len(FIELDS)
        self.count = [0] * len(FIELDS)
        self.stale: list[int] = []
        self.requests = 0
        self.errors = 0
        # Per gateway: [sum of millionths x us, sum of us, sum of millionths, windows].
        self.gateways: dict[str, list[int]] = {}

    def add(self, w: Window) -> None:
        micro = round(w.inflight_mean * MICRO)
        us = (w.end - w.start) // ONE_US
        if us < 0:  # noqa: PLR1730 (a comparison costs less than a call, per window)
            us = 0
        weighted = micro * us
        acc = self.gateways.get(w.gateway)
        if acc is None:
            acc = self.gateways[w.gateway] = [0, 0, 0, 0]
        acc[0] += weighted
        acc[1] += us
        acc[2] += micro
        acc[3] += 1
        self.rows.append((w, w.gateway, weighted, us, micro))
        self.requests += w.requests
        self.errors += w.errors
        if w.requests > 0:
            q, t, p = w.queue_wait_p99_s, w.ttft_p99_s, w.tpot_p99_s
            if q is None:
                q = ABSENT
            if t is None:
                t = ABSENT
            if p is None:
                p = ABSENT
        else:  # the p99s of a window that served nothing are not counted
            q = t = p = ABSENT
        vals = (w.waiting, w.inflight_max, w.replica_count, q, t, p)
        self.values.append(vals)
        top, count = self.top, self.count
        # Each maximum and how many hold it (unrolled: this is the round's hot loop).
        for i in _FIELD_INDEXES:
            v = vals[i]
            m = top[i]
            if v > m:
                top[i] = v
                count[i] = 1
            elif v == m:
                count[i] += 1

    def drop_oldest(self) -> None:
        w, gateway, weighted, us, micro = self.rows.popleft()
        acc = self.gateways[gateway]
        acc[0] -= weighted
        acc[1] -= us
        acc[2] -= micro
        acc[3] -= 1
        if acc[3] == 0:
            del self.gateways[gateway]
        self.requests -= w.requests
        self.errors -= w.errors
        vals = self.values.popleft()
        top, count = self.top, self.count
        for i in _FIELD_INDEXES:
            if vals[i] == top[i]:
                count[i] -= 1
                if count[i] == 0:
                    self.stale.append(i)

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
                column = [vals[i] for vals in self.values]
                top[i] = m = max(column)
                self.count[i] = column.count(m)
            self.stale.clear()
        waiting, inflight_max, replicas, queue, ttft, tpot = top
        return Summary(
            len(self.rows),
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


class Rolling:
    """Every model's live windows: those received after ``after`` (``expire``), folded in
    oldest first (``add``). ``summary(model)`` is the model's ``Summary`` of them."""

    def __init__(self) -> None:
        self.models: dict[str, _Model] = {}
        # Every live window's model, oldest first: expiry walks only what leaves.
        self._order: deque[tuple[datetime, _Model]] = deque()
        self.after: datetime | None = None
        self.newest: datetime | None = None

    def windows(self) -> list[Window]:
        """The live windows, oldest first."""
        return sorted((row[0] for m in self.models.values() for row in m.rows), key=_received)

    @classmethod
    def of(cls, windows: Iterable[Window]) -> Rolling:
        rolling = cls()
        rolling.add(windows)
        return rolling

    def add(self, windows: Iterable[Window]) -> None:
        """Fold in ``windows`` (any order among themselves). One received before a window
        already held, or at or before ``after``, cannot be queued in order: the whole set
        is folded again, which gives the same figures (see the module)."""
        fresh = sorted(windows, key=_received)
        if not fresh:
            return
        if self.after is not None and fresh[0].received_at <= self.after:
            fresh = [w for w in fresh if w.received_at > self.after]
            if not fresh:
                return
        if self.newest is not None and fresh[0].received_at < self.newest:
            fresh = sorted([*self.windows(), *fresh], key=_received)
            self.models, self._order = {}, deque()
        models, order = self.models, self._order
        for w in fresh:
            m = models.get(w.model)
            if m is None:
                m = models[w.model] = _Model(w.model)
            m.add(w)
            order.append((w.received_at, m))
        self.newest = fresh[-1].received_at

    def expire(self, after: datetime) -> None:
        """Fold out every window received at or before ``after``."""
        order, models = self._order, self.models
        while order and order[0][0] <= after:
            _, m = order.popleft()
            m.drop_oldest()
            if not m.rows:
                del models[m.name]
        if self.after is None or after > self.after:
            self.after = after

    def summary(self, model: str) -> Summary | None:
        """The model's summary; None when no live window is of it."""
        m = self.models.get(model)
        return None if m is None else m.summary()


def _received(w: Window) -> datetime:
    return w.received_at


def summarise(windows: Iterable[Window]) -> Summary:
    """One model's windows (all of them inside the decision's window) as one summary."""
    m = _Model()
    for w in sorted(windows, key=_received):
        m.add(w)
    return m.summary() if m.rows else Summary()
