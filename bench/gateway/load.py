"""The gateway benchmark's load generator: one process, ``connections`` keep-alive clients.

Run by ``bench.gateway.side_by_side`` as ``python -m bench.gateway.load JOB`` (JOB is JSON,
see ``Job``): it connects, sends ``warmup`` requests on each connection, prints ``warm`` and
waits; each ``go`` line on stdin then runs one timed window on the same connections and
prints one JSON line (``Window``); end of input ends it. The parent snapshots the gateway's
CPU time and memory between the lines, so what it bills a gateway is exactly the window's
work.

A client of its own, in a process of its own, because the client must not be the limit: raw
HTTP/1.1 on uvloop streams, each request's bytes prepared once, the answer read by its
framing (content-length or chunked) and never parsed as JSON. Each connection sends its next
request when the answer is whole (a closed loop, as the public gateway benchmarks drive
them), so ``connections`` is the concurrency. For a stream, the time of each server-sent
event is when the HTTP chunk holding it arrived; ``gaps`` are the times between successive
events of one answer, the per-token latency a client sees.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import uvloop


@dataclass(frozen=True)
class Job:
    host: str
    port: int
    path: str
    headers: dict[str, str]
    body: str
    connections: int
    seconds: float = 3.0  # a window lasts at least this long ...
    min_requests: int = 300  # ... and until this many answers (for the slow peers' p99)
    max_seconds: float = 20.0  # ... but never longer than this
    requests: int = 0  # when set, a window is exactly this many requests instead
    warmup: int = 20  # requests per connection before the first window


@dataclass
class Window:
    requests: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    seconds: float = 0.0
    client_cpu: float = 0.0
    latency: dict[str, float] = field(default_factory=dict)  # whole answer
    first: dict[str, float] = field(default_factory=dict)  # to the head, or the first event
    gap: dict[str, float] = field(default_factory=dict)  # between a stream's events
    events: int = 0  # server-sent events in all the window's answers
    overhead: dict[str, float] = field(default_factory=dict)  # x-llmgw-overhead-ms, seconds


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p90, p99, max and mean (nearest rank); empty for no values."""
    if not values:
        return {}
    ordered = sorted(values)
    n = len(ordered)

    def rank(q: float) -> float:
        return ordered[min(n - 1, max(0, int(q * n + 0.5) - 1))]

    return {
        "p50": rank(0.50),
        "p90": rank(0.90),
        "p99": rank(0.99),
        "max": ordered[-1],
        "mean": sum(ordered) / n,
        "n": float(n),
    }


class Samples:
    def __init__(self) -> None:
        self.latency: list[float] = []
        self.first: list[float] = []
        self.gap: list[float] = []
        self.overhead: list[float] = []  # what the gateway says it added (its header)
        self.events = 0
        self.errors = 0
        self.error_samples: list[str] = []

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(text[:300])


class Connection:
    def __init__(self, job: Job) -> None:
        self.job = job
        head = "".join(f"{k}: {v}\r\n" for k, v in job.headers.items())
        body = job.body.encode()
        self.request = (
            f"POST {job.path} HTTP/1.1\r\nHost: {job.host}:{job.port}\r\n{head}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(
            self.job.host, self.job.port, limit=1 << 20
        )

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def one(self, samples: Samples) -> None:
        """Send one request, read its whole answer, record its times."""
        if self.reader is None:
            await self.connect()
        reader, writer = self.reader, self.writer
        assert reader is not None and writer is not None
        clock = time.perf_counter
        start = clock()
        writer.write(self.request)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self.close()
            samples.error(f"connection lost before the answer: {exc!r}")
            return
        headed = clock()
        status, length, chunked, keep, overhead = _framing(head)
        times: list[float] = []
        try:
            if chunked:
                body = await _read_chunked(reader, times, keep_body=status != b"200")
            elif length >= 0:
                body = await reader.readexactly(length)
            else:
                body = await reader.read()
                keep = False
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self.close()
            samples.error(f"connection lost in the answer: {exc!r}")
            return
        end = clock()
        if not keep:
            self.close()
        if status != b"200":
            samples.error(f"{status.decode(errors='replace')}: {body[:200]!r}")
            return
        samples.latency.append(end - start)
        if overhead is not None:
            samples.overhead.append(overhead)
        if times:
            samples.first.append(times[0] - start)
            samples.gap.extend(b - a for a, b in itertools.pairwise(times))
            samples.events += len(times)
        else:
            samples.first.append(headed - start)


OVERHEAD = b"x-llmgw-overhead-ms"


def _framing(head: bytes) -> tuple[bytes, int, bool, bool, float | None]:
    """Status, content length (-1 if none), chunked, keep-alive, and our gateway's own
    ``x-llmgw-overhead-ms`` (None when absent), from an answer's head."""
    length = -1
    chunked, keep = False, True
    overhead = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif name == b"connection" and b"close" in value.lower():
            keep = False
        elif name == OVERHEAD:
            try:
                overhead = float(value) / 1000
            except ValueError:
                overhead = None
    return head[9:12], length, chunked, keep, overhead


async def _read_chunked(
    reader: asyncio.StreamReader, times: list[float], *, keep_body: bool
) -> bytes:
    """Read a chunked body; the arrival time of each server-sent event goes into ``times``."""
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers are sent
            return body
        data = await reader.readexactly(size + 2)
        times.extend([time.perf_counter()] * data.count(b"data:"))
        if keep_body and len(body) < 300:
            body += data


async def _window(connections: list[Connection], job: Job, fixed: int) -> Window:
    samples = Samples()
    began_cpu = time.process_time()
    began = time.perf_counter()
    sent = [0]
    stop = [False]

    async def loop(conn: Connection) -> None:
        while not stop[0]:
            if fixed and sent[0] >= fixed:
                return
            sent[0] += 1
            await conn.one(samples)

    async def clock() -> None:
        # Stop at `seconds` once `min_requests` answers are in, or at `max_seconds` anyway.
        await asyncio.sleep(job.seconds)
        deadline = began + job.max_seconds
        while len(samples.latency) + samples.errors < job.min_requests:
            if time.perf_counter() >= deadline:
                break
            await asyncio.sleep(0.05)
        stop[0] = True

    timer = None if fixed else asyncio.ensure_future(clock())
    await asyncio.gather(*(loop(c) for c in connections))
    if timer is not None:
        timer.cancel()
    return Window(
        requests=len(samples.latency),
        errors=samples.errors,
        error_samples=samples.error_samples,
        seconds=time.perf_counter() - began,
        client_cpu=time.process_time() - began_cpu,
        latency=percentiles(samples.latency),
        first=percentiles(samples.first),
        gap=percentiles(samples.gap),
        overhead=percentiles(samples.overhead),
        events=samples.events,
    )


async def run(job: Job) -> None:
    connections = [Connection(job) for _ in range(job.connections)]
    await asyncio.gather(*(c.connect() for c in connections))
    if job.warmup:
        await _window(connections, job, job.warmup * job.connections)
    loop = asyncio.get_running_loop()
    print("warm", flush=True)
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if line.strip() != "go":
            break
        window = await _window(connections, job, job.requests)
        print(json.dumps(asdict(window)), flush=True)
    for c in connections:
        c.close()


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.gateway.load", description=__doc__)
    parser.add_argument("job", metavar="JOB", help="the job as JSON (see Job)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    data: dict[str, Any] = json.loads(args.job)
    job = Job(**data)
    uvloop.run(run(job))
    return 0


if __name__ == "__main__":
    sys.exit(main())
