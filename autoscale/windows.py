"""Gateways' signal windows, and the summary one decision reads. Pure.

A gateway reports, every few seconds, one window per model it served: how many
requests, how many in flight on average and at most, p99 latencies. A decision
reads every window received in the last ``policy.window`` from every gateway and
summarises them per model:

- ``load``: concurrent requests, the sum over gateways of each gateway's
  duration-weighted mean of ``inflight_mean`` (gateways split the traffic, so
  their loads add);
- ``ttft_p99_s`` / ``tpot_p99_s`` / ``queue_wait_p99_s``: the highest p99 among
  windows that served requests. Percentiles of separate windows cannot be merged
  exactly; the highest is the conservative reading (a breach in any window of the
  last minute counts);
- ``waiting``: the most requests any window held for lack of a ready replica;
- ``replicas``: the most distinct replicas any one gateway window saw serving,
  which tells a decision whether replicas it asked for have started to take load.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    requests: int
    inflight_mean: float
    inflight_max: int


@dataclass(frozen=True, slots=True)
class Window:
    """One gateway's window of one model, as received (``received_at``: our clock)."""

    gateway: str
    model: str
    start: datetime
    end: datetime
    received_at: datetime
    requests: int = 0
    errors: int = 0
    waiting: int = 0
    inflight_mean: float = 0.0
    inflight_max: int = 0
    queue_wait_p99_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    replicas: Mapping[str, ReplicaLoad] = field(default_factory=dict)
    # How many replicas served in the window: all a decision reads of ``replicas``, kept
    # in a column of its own so that a round need not decode every window's JSON.
    replica_count: int = -1

    def __post_init__(self) -> None:
        if self.replica_count < 0:
            object.__setattr__(self, "replica_count", len(self.replicas))


@dataclass(frozen=True, slots=True)
class Summary:
    """What one decision knows of one model's traffic over its window."""

    windows: int = 0
    gateways: int = 0
    requests: int = 0
    errors: int = 0
    waiting: int = 0
    load: float = 0.0
    inflight_max: int = 0
    replicas: int = 0
    queue_wait_p99_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "windows": self.windows,
            "gateways": self.gateways,
            "requests": self.requests,
            "errors": self.errors,
            "waiting": self.waiting,
            "load": round(self.load, 6),
            "inflight_max": self.inflight_max,
            "replicas": self.replicas,
            "queue_wait_p99_s": self.queue_wait_p99_s,
            "ttft_p99_s": self.ttft_p99_s,
            "tpot_p99_s": self.tpot_p99_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Summary:
        return cls(**{k: data[k] for k in cls.__slots__ if k in data})


EMPTY = Summary()


def _higher(a: float | None, b: float | None) -> float | None:
    return b if a is None or (b is not None and b > a) else a


def summarise(windows: Iterable[Window]) -> Summary:
    """One model's windows (all of them inside the decision's window) as one summary.

    One pass with plain locals: a round summarises every model's minute of windows
    (24,000 windows for 1,000 models and 2 gateways), so this is most of its cost.
    """
    # Per gateway: the inflight_mean weighted by seconds, the seconds, the unweighted
    # sum and the count (for windows of no length).
    weighted: dict[str, list[float]] = {}
    count = requests = errors = waiting = inflight_max = replicas = 0
    queue = ttft = tpot = None
    for w in windows:
        count += 1
        seconds = (w.end - w.start).total_seconds()
        acc = weighted.get(w.gateway)
        if acc is None:
            acc = weighted[w.gateway] = [0.0, 0.0, 0.0, 0.0]
        if seconds > 0:
            acc[0] += w.inflight_mean * seconds
            acc[1] += seconds
        acc[2] += w.inflight_mean
        acc[3] += 1
        requests += w.requests
        errors += w.errors
        waiting = max(waiting, w.waiting)
        inflight_max = max(inflight_max, w.inflight_max)
        replicas = max(replicas, w.replica_count)
        if w.requests > 0:
            queue = _higher(queue, w.queue_wait_p99_s)
            ttft = _higher(ttft, w.ttft_p99_s)
            tpot = _higher(tpot, w.tpot_p99_s)
    if not count:
        return EMPTY
    load = 0.0
    for total, seconds, plain, n in weighted.values():
        load += total / seconds if seconds > 0 else plain / n
    return Summary(
        windows=count,
        gateways=len(weighted),
        requests=requests,
        errors=errors,
        waiting=waiting,
        # Rounded so that a summary read back from its JSON decides the same.
        load=round(load, 6),
        inflight_max=inflight_max,
        replicas=replicas,
        queue_wait_p99_s=queue,
        ttft_p99_s=ttft,
        tpot_p99_s=tpot,
    )


def in_window(windows: Iterable[Window], start: datetime, end: datetime) -> list[Window]:
    """The windows a decision at ``end`` reads: received after ``start``, at or before ``end``."""
    return [w for w in windows if start < w.received_at <= end]
