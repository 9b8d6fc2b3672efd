"""Gateways' signal windows, and the summary one decision reads. Pure.

A gateway reports, every few seconds, one window per model it served: how many
requests, how many in flight on average and at most, p99 latencies. A decision
reads every window received in the last ``policy.window`` from every gateway and
summarises them per model (``autoscale.rolling`` keeps the summaries up to date as
windows arrive and leave):

- ``load``: concurrent requests, the sum over gateways of each gateway's
  duration-weighted mean of ``inflight_mean`` (gateways split the traffic, so
  their loads add);
- ``ttft_p99_s`` / ``tpot_p99_s`` / ``queue_wait_p99_s``: the highest p99 among
  windows that served requests. Percentiles of separate windows cannot be merged
  exactly; the highest is the conservative reading (a breach in any window of the
  last minute counts);
- ``queue_wait_sustained_s``: the highest queue wait p99 that two consecutive windows
  of one gateway both reached (``sustained_queue_wait``): a queue that stayed long, not
  one burst. Taken only when a decision needs it (``autoscale.rounds``), else None;
- ``waiting``: the most requests any window held for lack of a ready replica;
- ``replicas``: the most distinct replicas any one gateway window saw serving,
  which tells a decision whether replicas it asked for have started to take load.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple


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


class Summary(NamedTuple):
    """What one decision knows of one model's traffic over its window.

    A named tuple rather than a frozen dataclass: a round makes one per model (1,000 and
    more), and a frozen dataclass's ``__init__`` costs several times as much."""

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
    # Taken only when ``queue_wait_p99_s`` is above the model's queue threshold (at or
    # below it, no two windows can be above it): None otherwise.
    queue_wait_sustained_s: float | None = None

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
            "queue_wait_sustained_s": self.queue_wait_sustained_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Summary:
        return cls(**{k: data[k] for k in cls._fields if k in data})


EMPTY = Summary()


def sustained_queue_wait(windows: Iterable[Window]) -> float | None:
    """The highest queue wait p99 two consecutive windows of one gateway both reached:
    over every pair of a gateway's windows where one starts where the other ended (a
    gateway's windows follow each other without a gap while it has traffic), the lower
    of the two p99s; None when no such pair served requests.

    Only windows that served requests count, as for the other p99s. A function of the
    set of windows (whatever their order), so the daemon and a backtest agree.
    """
    counted = [w for w in windows if w.requests > 0 and w.queue_wait_p99_s is not None]
    # (gateway, end) -> the highest p99 of a window of that gateway ending then.
    ended: dict[tuple[str, datetime], float] = {}
    for w in counted:
        q = w.queue_wait_p99_s
        assert q is not None
        key = (w.gateway, w.end)
        if q > ended.get(key, -1.0):
            ended[key] = q
    best: float | None = None
    for w in counted:
        before = ended.get((w.gateway, w.start))
        if before is None:
            continue
        q = w.queue_wait_p99_s
        assert q is not None
        pair = min(before, q)
        if best is None or pair > best:
            best = pair
    return best
