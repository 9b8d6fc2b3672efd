"""Signal windows for the autoscaler: compact per-model summaries of a few seconds.

Pure accumulation (the clock is passed in); ``gateway.signals`` posts each closed
window to the control plane's ``POST /v1/signals``. A window holds counts, the
time-weighted mean and the maximum of in-flight requests (per model and per replica),
and the p99 of queue wait, TTFT and TPOT over the requests it saw (a bounded sample).

What each count means, as the control plane checks it (``autoscale.signals``):
``requests`` are the requests that *finished* in the window and ``errors`` those of them
that failed, so ``errors <= requests`` holds in every window (a request started in one
window and failed in the next would break it if requests were counted at their start);
their TTFT/TPOT are the window's samples. ``waiting`` counts the requests that started
waiting for a replica in the window; in-flight (model and replica) covers every request
from its start, so a long request shows as load in each window it spans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

# Samples kept per series per window; beyond it, every other one is dropped (a p99 of
# 4096 samples is as good as of more for a scaling decision).
MAX_SAMPLES = 4096


@dataclass(slots=True)
class Level:
    """A count that goes up and down: its time-weighted mean and its maximum."""

    value: int = 0
    since: float = 0.0
    area: float = 0.0
    peak: int = 0

    def move(self, delta: int, now: float) -> None:
        self.area += self.value * (now - self.since)
        self.since = now
        self.value += delta
        self.peak = max(self.peak, self.value)

    def close(self, start: float, now: float) -> tuple[float, int]:
        self.area += self.value * (now - self.since)
        span = now - start
        mean = self.area / span if span > 0 else float(self.value)
        peak = self.peak
        # The next window starts where this one ends, at the level now.
        self.area, self.since, self.peak = 0.0, now, self.value
        return mean, peak


def _p99(xs: list[float]) -> float | None:
    if not xs:
        return None
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _add(xs: list[float], x: float) -> None:
    if len(xs) >= MAX_SAMPLES:
        del xs[::2]
    xs.append(x)


@dataclass(slots=True)
class ReplicaWindow:
    requests: int = 0
    inflight: Level = field(default_factory=Level)


@dataclass(slots=True)
class ModelWindow:
    requests: int = 0
    errors: int = 0
    waiting: int = 0
    inflight: Level = field(default_factory=Level)
    queue_wait: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    replicas: dict[str, ReplicaWindow] = field(default_factory=dict)

    def busy(self) -> bool:
        # Replica traffic and samples count too: a fallback serves requests asked of
        # another model, and its window must not be dropped for that.
        return bool(
            self.requests
            or self.waiting
            or self.inflight.value
            or self.inflight.peak
            or self.ttft
            or self.tpot
            or self.queue_wait
            or any(r.requests or r.inflight.peak for r in self.replicas.values())
        )


class Windows:
    """The open window of every model seen; ``close`` hands them out and opens the next."""

    def __init__(self, now: float, wall: float) -> None:
        self.start, self.wall_start = now, wall
        self.models: dict[str, ModelWindow] = {}

    def _model(self, model: str, now: float) -> ModelWindow:
        w = self.models.get(model)
        if w is None:
            w = self.models[model] = ModelWindow(inflight=Level(since=now))
        return w

    def started(self, model: str, now: float) -> None:
        self._model(model, now).inflight.move(1, now)

    def finished(self, model: str, now: float, *, error: bool) -> None:
        w = self._model(model, now)
        w.inflight.move(-1, now)
        w.requests += 1
        if error:
            w.errors += 1

    def waited(self, model: str, now: float) -> None:
        self._model(model, now).waiting += 1

    def sent(self, model: str, replica: str, now: float, queue_wait_s: float) -> None:
        w = self._model(model, now)
        _add(w.queue_wait, queue_wait_s)
        r = w.replicas.get(replica)
        if r is None:
            r = w.replicas[replica] = ReplicaWindow(inflight=Level(since=now))
        r.requests += 1
        r.inflight.move(1, now)

    def replied(self, model: str, replica: str, now: float) -> None:
        r = self._model(model, now).replicas.get(replica)
        if r is not None:
            r.inflight.move(-1, now)

    def timing(self, model: str, now: float, ttft_s: float | None, tpot_s: float | None) -> None:
        w = self._model(model, now)
        if ttft_s is not None:
            _add(w.ttft, ttft_s)
        if tpot_s is not None:
            _add(w.tpot, tpot_s)

    def close(self, now: float, wall: float) -> list[dict[str, Any]]:
        """The windows of the models that saw anything, as ``POST /v1/signals`` takes
        them; the next window opens at ``now``."""
        # The wall clock may step back (NTP) or stand still between two closes; a window
        # must still end after it starts, or the control plane refuses the whole report.
        # Stamps are whole microseconds, as they are written.
        wall = max(round(wall, 6), round(self.wall_start, 6) + 1e-6)
        start_iso = _iso(self.wall_start)
        end_iso = _iso(wall)
        out: list[dict[str, Any]] = []
        kept: dict[str, ModelWindow] = {}
        for model, w in self.models.items():
            busy = w.busy()
            mean, peak = w.inflight.close(self.start, now)
            replicas: dict[str, Any] = {}
            kept_replicas: dict[str, ReplicaWindow] = {}
            for key, r in w.replicas.items():
                r_mean, r_peak = r.inflight.close(self.start, now)
                if r.requests or r_peak:
                    replicas[key] = {
                        "requests": r.requests,
                        "inflight_mean": round(r_mean, 4),
                        "inflight_max": r_peak,
                    }
                if r.inflight.value:
                    kept_replicas[key] = ReplicaWindow(inflight=r.inflight)
            if busy:
                out.append(
                    {
                        "model": model,
                        "start": start_iso,
                        "end": end_iso,
                        "requests": w.requests,
                        "errors": w.errors,
                        "waiting": w.waiting,
                        "inflight_mean": round(mean, 4),
                        "inflight_max": peak,
                        "queue_wait_p99_s": _p99(w.queue_wait),
                        "ttft_p99_s": _p99(w.ttft),
                        "tpot_p99_s": _p99(w.tpot),
                        "replicas": replicas,
                    }
                )
            if w.inflight.value:  # requests still running carry over
                kept[model] = ModelWindow(inflight=w.inflight, replicas=kept_replicas)
        self.models = kept
        self.start, self.wall_start = now, wall
        return out


def _iso(wall: float) -> str:
    stamp = datetime.fromtimestamp(wall, UTC).isoformat(timespec="microseconds")
    return stamp.replace("+00:00", "Z")
