"""What bounding request heads (httpguard) costs on the API's request path.

``python -m bench.headers [--quick]`` serves the real API app (``create_app`` on a
fresh SQLite database) twice over: with uvicorn's plain httptools protocol, as
``llmgw serve`` shipped before, and with httpguard's protocol, as it runs now.
Each server is its own process; the load is one client process of ``CONNECTIONS``
keep-alive connections sending ``GET /healthz`` (a small GET, no database) in
raw HTTP/1.1, each waiting for its answer before the next. The two servers are
measured in turn, ``ROUNDS`` times, alternating, on the same machine in one run;
printed per round: requests a second and the p50 and p99 of a request's time.
A head's checks cost the same whatever the route, so the small GET shows them
at their largest share of a request.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time
from multiprocessing.process import BaseProcess
from pathlib import Path

import httpx

from bench import common

CONNECTIONS = 8
SECONDS, QUICK_SECONDS = 10.0, 3.0
ROUNDS = 3


def serve(mode: str, db_url: str, sock: socket.socket) -> None:
    """The API app on ``sock`` with uvicorn's plain httptools protocol, or httpguard's."""
    import uvicorn

    from catalog import Catalog
    from events.db import make_engine
    from httpguard import HeadLimits, uvicorn_options
    from llmgw import logs
    from llmgw.api.app import create_app
    from llmgw.api.services import Services
    from llmgw.api.settings import ApiSettings

    logs.configure(default_level="WARNING")
    services = Services.build(make_engine(db_url), Catalog.build([]), "-", ApiSettings())
    options = uvicorn_options(HeadLimits()) if mode == "guarded" else {"http": "httptools"}
    config = uvicorn.Config(
        create_app(services), log_config=None, access_log=False, lifespan="on", **options
    )
    uvicorn.Server(config).run(sockets=[sock])


async def _connection(host: str, port: int, end: float, times: list[float]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    request = f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    try:
        while time.perf_counter() < end:
            start = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if head[9:12] != b"200":
                raise RuntimeError(f"GET /healthz answered {head[:40]!r}")
            await reader.readexactly(length)
            times.append(time.perf_counter() - start)
    finally:
        writer.close()


def _load(url: str, seconds: float) -> tuple[float, float, float]:
    host, port = url.removeprefix("http://").split(":")
    times: list[float] = []

    async def main() -> None:
        end = time.perf_counter() + seconds
        await asyncio.gather(
            *(_connection(host, int(port), end, times) for _ in range(CONNECTIONS))
        )

    started = time.perf_counter()
    asyncio.run(main())
    elapsed = time.perf_counter() - started
    cuts = statistics.quantiles(times, n=100)
    return len(times) / elapsed, cuts[49] * 1000, cuts[98] * 1000


def _start(mode: str, db_url: str) -> tuple[BaseProcess, str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    proc = multiprocessing.get_context("spawn").Process(target=serve, args=(mode, db_url, sock))
    proc.start()
    sock.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the {mode} server never answered /healthz")


def run(quick: bool) -> list[common.Table]:
    seconds = QUICK_SECONDS if quick else SECONDS
    rows: list[list[str]] = []
    figures: dict[str, list[tuple[float, float, float]]] = {"plain": [], "guarded": []}
    with tempfile.TemporaryDirectory() as tmp:
        db_url = f"sqlite:///{Path(tmp) / 'llmgw.db'}"
        from events.db import make_engine
        from events.migrate import upgrade

        upgrade(make_engine(db_url))
        servers = {mode: _start(mode, db_url) for mode in ("plain", "guarded")}
        try:
            for _, url in servers.values():
                _load(url, 1.0)  # warm-up: imports, first requests
            for round_ in range(1, ROUNDS + 1):
                for mode in ("plain", "guarded"):
                    print(f"headers: round {round_}, {mode}", file=sys.stderr, flush=True)
                    measured = _load(servers[mode][1], seconds)
                    figures[mode].append(measured)
                    rps, p50, p99 = measured
                    rows.append([str(round_), mode, f"{rps:,.0f}", f"{p50:.2f}", f"{p99:.2f}"])
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.join(10)
    for mode in ("plain", "guarded"):
        rps, p50, p99 = (statistics.median(x[i] for x in figures[mode]) for i in range(3))
        rows.append(["median", mode, f"{rps:,.0f}", f"{p50:.2f}", f"{p99:.2f}"])
    ratio = statistics.median(x[0] for x in figures["guarded"]) / statistics.median(
        x[0] for x in figures["plain"]
    )
    return [
        common.Table(
            f"GET /healthz, {CONNECTIONS} keep-alive connections, {seconds:g} s a round, "
            f"{os.cpu_count()} cores shared with the client; guarded/plain requests/s "
            f"{ratio:.3f}",
            ["round", "protocol", "requests/s", "p50 ms", "p99 ms"],
            rows,
        )
    ]


if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    for table in run(quick):
        print(table.render())
