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

from collections import defaultdict
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

    @property
    def seconds(self) -> float:
        return max((self.end - self.start).total_seconds(), 0.0)


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


def _worst(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def summarise(windows: Iterable[Window]) -> Summary:
    """One model's windows (all of them inside the decision's window) as one summary."""
    ws = list(windows)
    if not ws:
        return EMPTY
    by_gateway: dict[str, list[Window]] = defaultdict(list)
    for w in ws:
        by_gateway[w.gateway].append(w)
    load = 0.0
    for own in by_gateway.values():
        seconds = sum(w.seconds for w in own)
        if seconds > 0:
            load += sum(w.inflight_mean * w.seconds for w in own) / seconds
        else:
            load += sum(w.inflight_mean for w in own) / len(own)
    served = [w for w in ws if w.requests > 0]
    return Summary(
        windows=len(ws),
        gateways=len(by_gateway),
        requests=sum(w.requests for w in ws),
        errors=sum(w.errors for w in ws),
        waiting=max(w.waiting for w in ws),
        # Rounded so that a summary read back from its JSON decides the same.
        load=round(load, 6),
        inflight_max=max(w.inflight_max for w in ws),
        replicas=max(len(w.replicas) for w in ws),
        queue_wait_p99_s=_worst(w.queue_wait_p99_s for w in served),
        ttft_p99_s=_worst(w.ttft_p99_s for w in served),
        tpot_p99_s=_worst(w.tpot_p99_s for w in served),
    )


def in_window(windows: Iterable[Window], start: datetime, end: datetime) -> list[Window]:
    """The windows a decision at ``end`` reads: received after ``start``, at or before ``end``."""
    return [w for w in windows if start < w.received_at <= end]
