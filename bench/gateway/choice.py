"""``python -m bench.gateway.choice``: which HTTP server and client the gateway is built on.

A quick measurement, not the gateway's benchmark (that is ``bench gateway``, with the
peers side by side): the same tiny proxy (read the body, POST it upstream, answer with
the upstream's body) written on each candidate, in a process of its own, in front of one
fast upstream stub (a raw asyncio protocol on uvloop with a fixed answer). A load
process on uvloop with a raw keep-alive client sends sequential requests (concurrency 1)
and 16 concurrent ones, interleaving the candidates, and prints the added latency
(through the proxy minus straight to the stub) and requests/s.

Candidates:

- ``uvicorn-asgi+aiohttp``: a raw ASGI app on uvicorn with httptools and uvloop; aiohttp's
  client upstream.
- ``aiohttp+aiohttp``: aiohttp's server and client (one library; uvloop's event loop).
- ``aiohttp+httpx``: aiohttp's server, httpx's async client upstream.
- ``aiohttp+raw``: aiohttp's server, a small pooled keep-alive client on asyncio streams
  (Content-Length bodies only: the floor a hand-written client could reach).

Results go to stdout as a markdown table; ``--requests N`` per run, ``--repeats R``.
First, the routing decision's cost with 64 replicas (``--routing-only``: that alone).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import signal
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

BODY = b'{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":8}'
ANSWER = (
    b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":'
    b'{"role":"assistant","content":"the cluster placed"},"finish_reason":"length"}]}'
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _stub(port: int) -> None:
    """The upstream: answers each request with ANSWER, keep-alive, as fast as it can."""
    import uvloop

    response = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(ANSWER)).encode()
        + b"\r\n\r\n"
        + ANSWER
    )

    class Stub(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.t = transport
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            self.buf += data
            while True:
                head_end = self.buf.find(b"\r\n\r\n")
                if head_end < 0:
                    return
                head = self.buf[:head_end].lower()
                i = head.find(b"content-length:")
                length = int(head[i + 15 :].split(b"\r\n", 1)[0]) if i >= 0 else 0
                end = head_end + 4 + length
                if len(self.buf) < end:
                    return
                self.buf = self.buf[end:]
                self.t.write(response)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Stub, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(main())


class RawPool:
    """Keep-alive connections to one host; Content-Length bodies only."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.idle:
            reader, writer = self.idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(
            b"POST " + path.encode() + b" HTTP/1.1\r\nhost: up\r\ncontent-type: "
            b"application/json\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        i = lower.find(b"content-length:")
        length = int(lower[i + 15 :].split(b"\r\n", 1)[0])
        data = await reader.readexactly(length)
        self.idle.append((reader, writer))
        return status, data


def _uvicorn_asgi(port: int, up: int) -> None:
    import aiohttp
    import uvicorn

    session: list[aiohttp.ClientSession] = []
    url = f"http://127.0.0.1:{up}/v1/chat/completions"

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    session.append(aiohttp.ClientSession())
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        more = True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        async with session[0].post(
            url, data=body, headers={"content-type": "application/json"}
        ) as r:
            data = await r.read()
            status = r.status
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})

    uvicorn.run(
        app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="error"
    )


def _aiohttp_server(port: int, up: int, client: str) -> None:
    import uvloop
    from aiohttp import web

    url = f"http://127.0.0.1:{up}/v1/chat/completions"

    async def main() -> None:
        post: Callable[[bytes], Any]
        if client == "aiohttp":
            import aiohttp

            s = aiohttp.ClientSession()

            async def post_aiohttp(body: bytes) -> tuple[int, bytes]:
                async with s.post(
                    url, data=body, headers={"content-type": "application/json"}
                ) as r:
                    return r.status, await r.read()

            post = post_aiohttp
        elif client == "httpx":
            import httpx

            h = httpx.AsyncClient()

            async def post_httpx(body: bytes) -> tuple[int, bytes]:
                r = await h.post(url, content=body, headers={"content-type": "application/json"})
                return r.status_code, r.content

            post = post_httpx
        else:
            pool = RawPool("127.0.0.1", up)

            async def post_raw(body: bytes) -> tuple[int, bytes]:
                return await pool.post("/v1/chat/completions", body)

            post = post_raw

        async def handle(request: web.Request) -> web.Response:
            status, data = await post(await request.read())
            return web.Response(status=status, body=data, content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/chat/completions", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    uvloop.run(main())


def _aiohttp_aiohttp(port: int, up: int) -> None:
    _aiohttp_server(port, up, "aiohttp")


def _aiohttp_httpx(port: int, up: int) -> None:
    _aiohttp_server(port, up, "httpx")


def _aiohttp_raw(port: int, up: int) -> None:
    _aiohttp_server(port, up, "raw")


CANDIDATES: dict[str, Callable[[int, int], None]] = {
    "uvicorn-asgi+aiohttp": _uvicorn_asgi,
    "aiohttp+aiohttp": _aiohttp_aiohttp,
    "aiohttp+httpx": _aiohttp_httpx,
    "aiohttp+raw": _aiohttp_raw,
}


def _load(port: int, n: int, concurrency: int) -> tuple[list[float], float]:
    """Latencies (s) of n requests at this concurrency, and the wall time."""
    import uvloop

    async def main() -> tuple[list[float], float]:
        pools = [RawPool("127.0.0.1", port) for _ in range(concurrency)]
        for p in pools:  # connections made before the clock starts
            await p.post("/v1/chat/completions", BODY)
        lat: list[float] = []
        per = n // concurrency

        async def worker(pool: RawPool) -> None:
            for _ in range(per):
                t = time.perf_counter()
                status, _ = await pool.post("/v1/chat/completions", BODY)
                lat.append(time.perf_counter() - t)
                assert status == 200

        start = time.perf_counter()
        await asyncio.gather(*(worker(p) for p in pools))
        return lat, time.perf_counter() - start

    return uvloop.run(main())


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def routing_decision(replicas: int = 64, n: int = 20000) -> None:
    """The gateway's routing decision (eligible + choose) with ``replicas`` replicas."""
    import timeit

    from gateway.stages.routing import Load, choose, eligible
    from gateway.table import Replica, stable_hash

    rs = [
        Replica(f"m/{i}", "m", f"http://h:{i}", 1.0, "p", stable_hash(f"m/{i}"))
        for i in range(replicas)
    ]
    loads = {r.key: Load(inflight=i % 5, picks=i) for i, r in enumerate(rs)}
    print(f"| routing profile | decision with {replicas} replicas (us) |")
    print("|---|---:|")
    for profile in ("least-loaded", "round-robin", "session", "latency"):

        def decide(profile: str = profile) -> None:
            choose(profile, eligible(rs, loads, 0.0), loads, session="user-1", ttft_slo_s=0.5)

        t = timeit.timeit(decide, number=n)
        print(f"| {profile} | {t / n * 1e6:.1f} |")
    # prefix: a 4k-token chat (about 16k characters: a system prompt every replica holds,
    # then a conversation one of them holds), hashed, scored and recorded per decision.
    from gateway.stages.prefix import PrefixTable, prompt_of

    table = PrefixTable()
    system = {"role": "system", "content": "You are a careful assistant. " * 280}
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "w " * 400}
        for i in range(10)
    ]
    body = {"messages": [system, *turns]}
    head = prompt_of({"messages": [system]}, "chat")
    whole = prompt_of(body, "chat")
    assert head is not None and whole is not None
    for r in rs:
        table.record(r.key, head, 0)
    table.record(rs[7].key, whole, 0)

    def decide_prefix() -> None:
        prompt = prompt_of(body, "chat")
        got = choose("prefix", eligible(rs, loads, 0.0), loads, prompt=prompt, prefixes=table)
        assert got is not None and prompt is not None
        table.record(got.replica.key, prompt, got.prefix_blocks)

    m = n // 10
    t = timeit.timeit(decide_prefix, number=m)
    print(f"| prefix (4k-token chat: hashed, scored, recorded) | {t / m * 1e6:.1f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gateway.choice")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--routing-only", action="store_true", help="only the routing decision")
    args = p.parse_args(argv)
    routing_decision()
    if args.routing_only:
        return 0
    ctx = mp.get_context("spawn")
    up = _free_port()
    procs = [ctx.Process(target=_stub, args=(up,), daemon=True)]
    ports = {"direct": up}
    for name, target in CANDIDATES.items():
        ports[name] = _free_port()
        procs.append(ctx.Process(target=target, args=(ports[name], up), daemon=True))
    for proc in procs:
        proc.start()
    try:
        for port in ports.values():
            _wait_port(port)
        results: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
        for _ in range(args.repeats):
            for conc in (1, 16):
                for name, port in ports.items():  # interleaved: load drifts over all alike
                    lat, wall = _load(port, args.requests, conc)
                    results.setdefault((name, conc), []).append(
                        (_pct(lat, 0.5), _pct(lat, 0.99), len(lat) / wall)
                    )
        print("| candidate | conc | added p50 ms | added p99 ms | requests/s |")
        print("|---|---:|---:|---:|---:|")
        for conc in (1, 16):
            base = results[("direct", conc)]
            b50 = statistics.median(r[0] for r in base)
            b99 = statistics.median(r[1] for r in base)
            for name in ports:
                rs = results[(name, conc)]
                p50 = statistics.median(r[0] for r in rs)
                p99 = statistics.median(r[1] for r in rs)
                rps = statistics.median(r[2] for r in rs)
                added = (p50 - b50) * 1e3, (p99 - b99) * 1e3
                shown = "-" if name == "direct" else f"{added[0]:.3f}"
                shown99 = "-" if name == "direct" else f"{added[1]:.3f}"
                print(f"| {name} | {conc} | {shown} | {shown99} | {rps:,.0f} |")
        sys.stdout.flush()
    finally:
        for proc in procs:
            if proc.pid is not None:
                os.kill(proc.pid, signal.SIGTERM)
            proc.join(5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
