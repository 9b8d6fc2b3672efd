"""``llmgw bench``'s load driver: streamed chat completions at a fixed concurrency. I/O.

Each of ``concurrency`` threads keeps one HTTP/1.1 connection and sends streamed
requests back to back for the step's duration, timing each: TTFT is the time from
sending to the first chunk with content, TPOT the time between the first and the
last content chunk divided by the chunks after the first. The standard library's
``http.client`` is enough (no dependency for a command most clusters run rarely),
and threads spend their time waiting on sockets, so 64 of them fit on two cores.

The response headers ``x-llmgw-replica`` name the replica that served each request,
so a bench can tell whether it measured one replica, as it must.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field

from autoscale.steps import Step, p99

# An SSE line longer than this is not a chat chunk.
MAX_LINE = 1 << 16
REPLICA_HEADER = "x-llmgw-replica"


@dataclass
class Sample:
    ttft: float | None = None
    tpot: float | None = None
    ok: bool = False


@dataclass
class Target:
    url: str
    token: str
    model: str
    max_tokens: int = 32
    prompt: str = "Say something about load tests."
    timeout: float = 60.0


@dataclass
class StepResult:
    step: Step
    replicas: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


def _connection(url: urllib.parse.SplitResult, timeout: float) -> http.client.HTTPConnection:
    port = url.port
    if url.scheme == "https":
        return http.client.HTTPSConnection(url.hostname or "", port, timeout=timeout)
    return http.client.HTTPConnection(url.hostname or "", port, timeout=timeout)


def _one(
    conn: http.client.HTTPConnection, path: str, target: Target, replicas: Counter[str]
) -> tuple[Sample, str | None]:
    body = json.dumps(
        {
            "model": target.model,
            "messages": [{"role": "user", "content": target.prompt}],
            "max_tokens": target.max_tokens,
            "stream": True,
        }
    )
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {target.token}",
        "Accept": "text/event-stream",
    }
    sent = time.perf_counter()
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    served = response.getheader(REPLICA_HEADER)
    if served:
        replicas[served[:200]] += 1
    if response.status != 200:
        response.read()
        return Sample(), f"HTTP {response.status}"
    first = last = None
    chunks = 0
    while True:
        line = response.readline(MAX_LINE)
        if not line:
            break
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            response.read()
            break
        try:
            delta = json.loads(data)["choices"][0].get("delta", {})
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            continue
        if delta.get("content"):
            now = time.perf_counter()
            first = first if first is not None else now
            last = now
            chunks += 1
    if first is None or last is None:
        return Sample(), "no content streamed"
    tpot = (last - first) / (chunks - 1) if chunks > 1 else None
    return Sample(first - sent, tpot, True), None


def run_step(target: Target, concurrency: int, seconds: float) -> StepResult:
    """``concurrency`` clients sending back to back for ``seconds``; the step's figures."""
    url = urllib.parse.urlsplit(target.url.rstrip("/"))
    path = (url.path or "") + "/v1/chat/completions"
    samples: list[Sample] = []
    replicas: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def worker() -> None:
        own: list[Sample] = []
        seen: Counter[str] = Counter()
        failed: Counter[str] = Counter()
        conn = _connection(url, target.timeout)
        try:
            while time.monotonic() < deadline:
                try:
                    sample, error = _one(conn, path, target, seen)
                except (OSError, http.client.HTTPException) as exc:
                    sample, error = Sample(), type(exc).__name__
                    conn.close()
                    conn = _connection(url, target.timeout)
                own.append(sample)
                if error:
                    failed[error] += 1
        finally:
            conn.close()
        with lock:
            samples.extend(own)
            replicas.update(seen)
            errors.update(failed)

    started = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    ok = [s for s in samples if s.ok]
    step = Step(
        concurrency=concurrency,
        requests=len(samples),
        errors=len(samples) - len(ok),
        ttft_p99_s=p99([s.ttft for s in ok if s.ttft is not None]),
        tpot_p99_s=p99([s.tpot for s in ok if s.tpot is not None]),
        seconds=elapsed,
    )
    return StepResult(step, replicas, errors)
