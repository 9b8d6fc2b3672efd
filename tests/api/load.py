"""Concurrent clients for a running ``llmgw serve``: agents reporting, readers listing models.

Used by the tests (bounded) and runnable on its own for the numbers in the
report: ``python -m tests.api.load [--db URL] [--agents 50] [--reports 40]``
starts a server on a free loopback port, drives it, prints requests/s and
latency percentiles, and stops it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass(frozen=True)
class Stats:
    requests: int
    seconds: float
    latencies_ms: tuple[float, ...]
    failures: tuple[str, ...]

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

    def line(self, what: str) -> str:
        return (
            f"{what}: {self.requests} requests in {self.seconds:.2f}s = {self.rate:.0f}/s; "
            f"p50 {self.percentile(0.5):.1f} ms, p99 {self.percentile(0.99):.1f} ms, "
            f"mean {statistics.fmean(self.latencies_ms):.1f} ms; {len(self.failures)} failures"
        )


def _drive(
    workers: int, per_worker: int, make: Callable[[int], Callable[[int], str | None]]
) -> Stats:
    """``workers`` threads, each calling its function ``per_worker`` times, started together."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(workers + 1)

    def worker(i: int) -> None:
        call = make(i)
        mine: list[float] = []
        start.wait()
        for k in range(per_worker):
            began = time.perf_counter()
            problem = call(k)
            mine.append((time.perf_counter() - began) * 1000)
            if problem is not None:
                with lock:
                    failures.append(problem)
        with lock:
            latencies.extend(mine)

    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(worker, i) for i in range(workers)]
        start.wait()
        began = time.perf_counter()
        for f in futures:
            f.result()
        elapsed = time.perf_counter() - began
    return Stats(workers * per_worker, elapsed, tuple(latencies), tuple(failures))


def report_body(k: int) -> dict[str, object]:
    """Report number ``k`` of an agent: what changes from one report to the next is visible."""
    return {"gpu_class": "T4", "gpus": 4, "gpus_reserved": k % 5, "labels": {"seq": str(k)}}


def agents(url: str, tokens: dict[str, str], reports: int) -> Stats:
    """One agent per (node, token), each reporting ``reports`` times on its own connection."""
    nodes = sorted(tokens)

    def make(i: int) -> Callable[[int], str | None]:
        node = nodes[i]
        client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {tokens[node]}"}, timeout=60
        )

        def call(k: int) -> str | None:
            response = client.put(f"/v1/nodes/{node}", json=report_body(k))
            return None if response.status_code == 200 else f"{node}#{k}: {response.status_code}"

        return call

    return _drive(len(nodes), reports, make)


def readers(url: str, token: str, clients: int, requests: int, path: str = "/v1/models") -> Stats:
    def make(_: int) -> Callable[[int], str | None]:
        client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        )

        def call(k: int) -> str | None:
            response = client.get(path)
            return None if response.status_code == 200 else f"GET {path}: {response.status_code}"

        return call

    return _drive(clients, requests, make)


def main() -> None:
    from tests.api.server import ApiServer, Tokens, running

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", help="database URL (default: a new SQLite file)")
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--reports", type=int, default=40)
    parser.add_argument("--readers", type=int, default=50)
    parser.add_argument("--reads", type=int, default=100)
    args = parser.parse_args()
    nodes = [f"node-{i:03d}" for i in range(args.agents)]
    tokens = Tokens.issue(nodes)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        url = args.db or f"sqlite:///{workdir / 'llmgw.db'}"
        server = ApiServer(workdir, url, tokens=tokens)
        with running(server):
            readers(server.url, tokens.reader, 4, 20)  # warm up
            print(
                readers(server.url, tokens.reader, args.readers, args.reads).line("GET /v1/models")
            )
            print(agents(server.url, tokens.agents, args.reports).line("PUT /v1/nodes/{name}"))
            print(
                readers(server.url, tokens.reader, args.readers, args.reads).line(
                    "GET /v1/models (again)"
                )
            )


if __name__ == "__main__":
    main()
