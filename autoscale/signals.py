"""A gateway's ``POST /v1/signals`` body, checked field by field. Pure.

    {"gateway": "gw-1", "worker": 0,
     "windows": [{"model": "chat", "start": "2026-12-04T10:00:00Z", "end": "...05Z",
                  "requests": 12, "errors": 0, "waiting": 0,
                  "inflight_mean": 1.5, "inflight_max": 3,
                  "queue_wait_p99_s": 0.01, "ttft_p99_s": 0.2, "tpot_p99_s": 0.03,
                  "replicas": {"chat/0": {"requests": 12, "inflight_mean": 1.5,
                                          "inflight_max": 3}}}]}

Every bound is here, so that nothing a gateway (or anyone holding its token) sends
can grow a table beyond what a window is: at most ``MAX_WINDOWS`` windows and
``MAX_REPLICAS`` replicas per window, counts and latencies within sane ranges, a
window at most ``MAX_WINDOW`` long. Every problem is named with its path
(``windows[3].ttft_p99_s``) and the limit, and nothing is stored unless all is valid.

Who posted is not the body's to say. A gateway's identity in the signals, the one the
autoscaler sums over, is its token's name and its worker number (``identity``):
``gw-a-w0``, ``gw-a-w1`` for the two workers of ``llmgw gateway --workers 2`` holding
the gateway token ``gw-a``. The body's ``gateway`` (the gateway's ``--id``) is a label
for the log, never a key: a token posting under invented ids posts as itself, and a
token has at most ``MAX_WORKERS`` identities (``worker`` from 0 to ``MAX_WORKERS - 1``),
so no one token counts as more gateways than that.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from autoscale.windows import ReplicaLoad, Window

MAX_WINDOWS = 2_000
MAX_REPLICAS = 1_000
MAX_COUNT = 1_000_000_000
MAX_INFLIGHT = 10_000_000.0
MAX_LATENCY_S = 86_400.0
MAX_WINDOW = timedelta(hours=1)
MAX_NAME = 255
MAX_PROBLEMS = 20
# Worker numbers a token may post under: the identities one token has in the signals
# (llmgw gateway --workers is held to this many too).
MAX_WORKERS = 64
# A gateway (a token's name and worker) counts as live, in the answer to its posts that
# tells each gateway how many there are (``gateways``), while it posted within this long:
# three of the default 5 s signals intervals.
LIVE_S = 15.0
# A gateway id becomes a column and a log field: printable, no spaces, no quoting needed.
GATEWAY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
# Model names and replica keys are the catalog's and the gateway's; bounded and printable.
PRINTABLE = re.compile(r"[^\x00-\x1f\x7f]{1,255}")

WINDOW_KEYS = frozenset(
    {
        "model",
        "start",
        "end",
        "requests",
        "errors",
        "waiting",
        "inflight_mean",
        "inflight_max",
        "queue_wait_p99_s",
        "ttft_p99_s",
        "tpot_p99_s",
        "replicas",
    }
)
REPLICA_KEYS = frozenset({"requests", "inflight_mean", "inflight_max"})


class SignalsError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        shown = problems[:MAX_PROBLEMS]
        more = len(problems) - len(shown)
        super().__init__("; ".join(shown) + (f"; and {more} more" if more else ""))
        self.problems = problems


def identity(token: str, worker: int) -> str:
    """Who posted, as the autoscaler counts gateways: the token's name and the worker."""
    return f"{token}-w{worker}"


@dataclass(frozen=True, slots=True)
class Signals:
    # The gateway's own id (its --id): a label for the log, not who posted.
    gateway: str
    windows: tuple[Window, ...]
    worker: int = 0

    def received(self, at: datetime, poster: str) -> tuple[Window, ...]:
        """The windows stamped with the control plane's time of receipt and ``poster``, the
        identity that posted them (``identity``)."""
        return tuple(
            Window(
                gateway=poster,
                model=w.model,
                start=w.start,
                end=w.end,
                received_at=at,
                requests=w.requests,
                errors=w.errors,
                waiting=w.waiting,
                inflight_mean=w.inflight_mean,
                inflight_max=w.inflight_max,
                queue_wait_p99_s=w.queue_wait_p99_s,
                ttft_p99_s=w.ttft_p99_s,
                tpot_p99_s=w.tpot_p99_s,
                replicas=w.replicas,
            )
            for w in self.windows
        )


class _Checker:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, message: str) -> None:
        self.problems.append(message)

    def count(self, data: Mapping[str, Any], key: str, at: str, default: int | None = 0) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
            self.fail(f"{at}.{key} must be a whole number from 0 to {MAX_COUNT}, not {_v(value)}")
            return 0
        return value

    def number(self, data: Mapping[str, Any], key: str, at: str, top: float) -> float:
        value = data.get(key, 0.0)
        # (The range first: an integer past a float's range, which JSON reads whole, is
        # out of it, where ``isfinite`` would raise OverflowError; NaN is out of it too.)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 <= value <= top
            or not math.isfinite(value)
        ):
            self.fail(f"{at}.{key} must be a number from 0 to {top:g}, not {_v(value)}")
            return 0.0
        return float(value)

    def latency(self, data: Mapping[str, Any], key: str, at: str) -> float | None:
        if data.get(key) is None:
            return None
        return self.number(data, key, at, MAX_LATENCY_S)

    def time(self, data: Mapping[str, Any], key: str, at: str) -> datetime | None:
        value = data.get(key)
        if not isinstance(value, str) or len(value) > 40:
            self.fail(f"{at}.{key} must be an ISO 8601 time with its zone, not {_v(value)}")
            return None
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            self.fail(f"{at}.{key} {_v(value)} is not an ISO 8601 time")
            return None
        if parsed.tzinfo is None:
            self.fail(f"{at}.{key} {_v(value)} has no zone; write it in UTC, e.g. ...T10:00:00Z")
            return None
        return parsed


def _v(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_signals(data: Any) -> Signals:
    """The body as ``Signals``, or ``SignalsError`` naming every problem (nothing partial)."""
    c = _Checker()
    if not isinstance(data, Mapping):
        raise SignalsError(["the body must be a JSON object with gateway and windows"])
    extra = sorted(set(data) - {"gateway", "worker", "windows"})
    if extra:
        c.fail(
            f"unknown key(s) {', '.join(map(_v, extra))}; a report has gateway, worker and windows"
        )
    gateway = data.get("gateway")
    if not isinstance(gateway, str) or not GATEWAY.fullmatch(gateway):
        c.fail(
            f"gateway {_v(gateway)} must be 1-128 letters, digits or ._:@- "
            "(the gateway's id, as in its --id or host name)"
        )
        gateway = ""
    worker = data.get("worker", 0)
    if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < MAX_WORKERS:
        c.fail(
            f"worker {_v(worker)} must be a whole number from 0 to {MAX_WORKERS - 1}: a "
            "gateway token posts as its name and a worker number, at most "
            f"{MAX_WORKERS} of them (llmgw gateway --workers); give each gateway its own "
            "token (llmgw token new NAME --role gateway)"
        )
        worker = 0
    raw = data.get("windows")
    if not isinstance(raw, list):
        c.fail("windows must be a list (empty when the gateway served nothing)")
        raw = []
    if len(raw) > MAX_WINDOWS:
        raise SignalsError([f"windows has {len(raw)} entries; at most {MAX_WINDOWS} per report"])
    windows = [w for i, item in enumerate(raw) if (w := _window(c, item, f"windows[{i}]"))]
    if c.problems:
        raise SignalsError(c.problems)
    return Signals(gateway, tuple(windows), worker)


def _window(c: _Checker, item: Any, at: str) -> Window | None:
    if not isinstance(item, Mapping):
        c.fail(f"{at} must be an object")
        return None
    before = len(c.problems)
    extra = sorted(set(item) - WINDOW_KEYS)
    if extra:
        c.fail(f"{at}: unknown key(s) {', '.join(map(_v, extra))}")
    model = item.get("model")
    if not isinstance(model, str) or not PRINTABLE.fullmatch(model):
        c.fail(f"{at}.model must be the model's catalog name (1-{MAX_NAME} printable characters)")
    start, end = c.time(item, "start", at), c.time(item, "end", at)
    if start is not None and end is not None and not timedelta(0) < end - start <= MAX_WINDOW:
        c.fail(f"{at}: end must be after start, by at most {MAX_WINDOW.total_seconds():g}s")
    requests = c.count(item, "requests", at)
    errors = c.count(item, "errors", at)
    if errors > requests:
        c.fail(f"{at}.errors ({errors}) cannot exceed requests ({requests})")
    replicas = item.get("replicas", {})
    loads: dict[str, ReplicaLoad] = {}
    if not isinstance(replicas, Mapping):
        c.fail(f"{at}.replicas must be an object of replica key to load")
    elif len(replicas) > MAX_REPLICAS:
        c.fail(f"{at}.replicas has {len(replicas)} entries; at most {MAX_REPLICAS}")
    else:
        for key, load in replicas.items():
            where = f"{at}.replicas[{_v(key)}]"
            if not isinstance(key, str) or not PRINTABLE.fullmatch(key):
                c.fail(f"{where}: a replica key is 1-{MAX_NAME} printable characters")
                continue
            if not isinstance(load, Mapping) or set(load) - REPLICA_KEYS:
                c.fail(f"{where} must be an object of {', '.join(sorted(REPLICA_KEYS))}")
                continue
            loads[key] = ReplicaLoad(
                c.count(load, "requests", where),
                c.number(load, "inflight_mean", where, MAX_INFLIGHT),
                c.count(load, "inflight_max", where),
            )
    window = Window(
        gateway="",
        model=model if isinstance(model, str) else "",
        start=start or datetime.min,
        end=end or datetime.min,
        received_at=end or datetime.min,
        requests=requests,
        errors=errors,
        waiting=c.count(item, "waiting", at),
        inflight_mean=c.number(item, "inflight_mean", at, MAX_INFLIGHT),
        inflight_max=c.count(item, "inflight_max", at),
        queue_wait_p99_s=c.latency(item, "queue_wait_p99_s", at),
        ttft_p99_s=c.latency(item, "ttft_p99_s", at),
        tpot_p99_s=c.latency(item, "tpot_p99_s", at),
        replicas=loads,
    )
    return window if len(c.problems) == before else None
