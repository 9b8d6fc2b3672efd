"""What bounding request heads (httpguard) costs on the API's request path.

``python -m bench.api.headers [--quick]`` serves the real API app (``create_app`` on a
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
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path

import httpx

from bench.shared import common

CONNECTIONS = 8
SECONDS, QUICK_SECONDS = 10.0, 3.0
ROUNDS = 3


def serve(mode: str, db_url: str, sock: socket.socket) -> None:
    """The API app on ``sock`` with uvicorn's plain httptools protocol, or httpguard's."""
    import uvicorn

    from catalog import Catalog
    from events.database.connection import make_engine
    from httpguard.limits import HeadLimits
    from httpguard.protocol import uvicorn_options
    from llmgw import logs
    from llmgw.api.app import create_app
    from llmgw.api.runtime.services import Services
    from llmgw.api.runtime.settings import ApiSettings

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


class _Transport:
    """Enough of an asyncio transport for a protocol to answer into."""

    def __init__(self) -> None:
        self.answers = 0
        self.closing = False

    def write(self, data: bytes) -> None:
        self.answers += data.startswith(b"HTTP/1.1 200")

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 8080) if name in ("sockname", "peername") else default

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def set_protocol(self, protocol: object) -> None: ...


async def _app(scope: dict[str, object], receive: object, send: Callable[..., object]) -> None:
    # The smallest answer: what is measured is the protocol, not an application.
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )  # type: ignore[misc]
    await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[misc]


def _protocol_cpu(mode: str, requests: int) -> float:
    """CPU microseconds a request costs the protocol alone (no socket, a no-op app)."""
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn.server import ServerState

    from httpguard.limits import HeadLimits
    from httpguard.protocol import guarded_protocol

    cls = guarded_protocol(HeadLimits()) if mode == "guarded" else HttpToolsProtocol
    config = uvicorn.Config(_app, log_config=None, access_log=False, lifespan="off")
    config.load()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    protocol = cls(config, ServerState(), {}, _loop=loop)
    transport = _Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    request = b"GET /healthz HTTP/1.1\r\nHost: llmgw\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"

    async def drive() -> float:
        start = time.process_time()
        for _ in range(requests):
            protocol.data_received(request)
            while not protocol.cycle.response_complete:
                await asyncio.sleep(0)
        return time.process_time() - start

    try:
        spent = loop.run_until_complete(drive())
    finally:
        protocol.connection_lost(None)
        loop.close()
    if transport.answers != requests:
        raise RuntimeError(f"{mode}: {transport.answers} answers to {requests} requests")
    return spent / requests * 1e6


def run(quick: bool) -> list[common.Table]:
    return [_protocol_table(quick), _http_table(quick)]


def _protocol_table(quick: bool) -> common.Table:
    requests = 5_000 if quick else 50_000
    table = common.Table(
        f"The protocol alone: CPU a request (µs), {requests:,} requests a round, no socket",
        ["round", "plain", "guarded", "guarded - plain"],
    )
    spent: dict[str, list[float]] = {"plain": [], "guarded": []}
    for round_ in range(1, ROUNDS + 1):
        for mode in ("plain", "guarded"):
            spent[mode].append(_protocol_cpu(mode, requests))
        plain, guarded = spent["plain"][-1], spent["guarded"][-1]
        table.add(round_, f"{plain:.1f}", f"{guarded:.1f}", f"{guarded - plain:+.1f}")
    plain, guarded = statistics.median(spent["plain"]), statistics.median(spent["guarded"])
    table.add("median", f"{plain:.1f}", f"{guarded:.1f}", f"{guarded - plain:+.1f}")
    return table


def _http_table(quick: bool) -> common.Table:
    seconds = QUICK_SECONDS if quick else SECONDS
    rows: list[list[str]] = []
    figures: dict[str, list[tuple[float, float, float]]] = {"plain": [], "guarded": []}
    with tempfile.TemporaryDirectory() as tmp:
        db_url = f"sqlite:///{Path(tmp) / 'llmgw.db'}"
        from events.database.connection import make_engine
        from events.database.migrate import upgrade

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
    return common.Table(
        f"GET /healthz, {CONNECTIONS} keep-alive connections, {seconds:g} s a round, "
        f"{os.cpu_count()} cores shared with the client; guarded/plain requests/s "
        f"{ratio:.3f}",
        ["round", "protocol", "requests/s", "p50 ms", "p99 ms"],
        rows,
    )


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.api.headers", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs, to iterate")
    for table in run(parser.parse_args().quick):
        print(table.render())
