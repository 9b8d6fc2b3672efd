"""``python -m bench.gateway.candidates KIND --upstream URL --port P``: a minimal pass-through.

The gateway benchmark (``bench.gateway.side_by_side``) runs these beside the peers, so that
the choice of the gateway's HTTP server and upstream client is made by measurement: each is
the least a gateway on that stack must do (read the request, POST it to the upstream on a
pooled keep-alive connection, answer with the upstream's status and body, a stream passed on
chunk by chunk as it arrives), and nothing more (no routing, admission or metrics). What one
scores is a floor for a real gateway on the same stack.

Kinds:

- ``uvicorn-aiohttp``: a raw ASGI app (no framework) on uvicorn with httptools and uvloop;
  aiohttp's client upstream.
- ``uvicorn-httpx``: the same server; httpx's async client upstream.
- ``aiohttp``: aiohttp's server and client, on uvloop.

``GET /healthz`` answers 200 on each. Prints ``listening on http://HOST:PORT`` once bound.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

KINDS = ("uvicorn-aiohttp", "uvicorn-httpx", "aiohttp")
POOL = 1024  # upstream connections kept: more than the benchmark's highest concurrency
UPSTREAM_HEADERS = {"content-type": "application/json"}

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _is_stream(content_type: str) -> bool:
    return content_type.startswith("text/event-stream")


def _asgi(upstream: str, kind: str) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """A raw ASGI pass-through on ``kind``'s client (``aiohttp`` or ``httpx``)."""
    state: dict[str, Any] = {}

    async def lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if kind == "aiohttp":
                    import aiohttp

                    state["client"] = aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=POOL, keepalive_timeout=60),
                        skip_auto_headers=("User-Agent",),
                    )
                else:
                    import httpx

                    state["client"] = httpx.AsyncClient(
                        limits=httpx.Limits(max_connections=POOL, max_keepalive_connections=POOL),
                        timeout=60,
                    )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                client = state.get("client")
                if client is not None:
                    await (client.close() if kind == "aiohttp" else client.aclose())
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        url = upstream + scope["path"]
        if kind == "aiohttp":
            await _via_aiohttp(state["client"], url, body, send)
        else:
            await _via_httpx(state["client"], url, body, send)

    return app


async def _via_aiohttp(client: Any, url: str, body: bytes, send: Send) -> None:
    async with client.post(url, data=body, headers=UPSTREAM_HEADERS) as answer:
        ctype = answer.headers.get("content-type", "application/json")
        if _is_stream(ctype):
            await _start(send, answer.status, ctype)
            async for chunk in answer.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            data = await answer.read()
            await _start(send, answer.status, ctype, len(data))
            await send({"type": "http.response.body", "body": data})


async def _via_httpx(client: Any, url: str, body: bytes, send: Send) -> None:
    request = client.build_request("POST", url, content=body, headers=UPSTREAM_HEADERS)
    answer = await client.send(request, stream=True)
    try:
        ctype = answer.headers.get("content-type", "application/json")
        if _is_stream(ctype):
            await _start(send, answer.status_code, ctype)
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            data = await answer.aread()
            await _start(send, answer.status_code, ctype, len(data))
            await send({"type": "http.response.body", "body": data})
    finally:
        await answer.aclose()


async def _start(send: Send, status: int, ctype: str, length: int | None = None) -> None:
    headers = [(b"content-type", ctype.encode())]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def _serve_uvicorn(kind: str, upstream: str, host: str, port: int) -> None:
    import uvicorn

    config = uvicorn.Config(
        _asgi(upstream, kind.removeprefix("uvicorn-")),
        host=host,
        port=port,
        loop="none",  # already on uvloop (main)
        http="httptools",
        lifespan="on",
        log_level="warning",
        access_log=False,
    )
    server = uvicorn.Server(config)
    started = asyncio.ensure_future(server.serve())
    while not server.started:
        if started.done():
            started.result()
            return
        await asyncio.sleep(0.01)
    print(f"listening on http://{host}:{port}", flush=True)
    await started


async def _serve_aiohttp(upstream: str, host: str, port: int) -> None:
    import aiohttp
    from aiohttp import web

    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=POOL, keepalive_timeout=60),
        skip_auto_headers=("User-Agent",),
    )

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with session.post(
            upstream + request.path, data=body, headers=UPSTREAM_HEADERS
        ) as answer:
            ctype = answer.headers.get("content-type", "application/json")
            if _is_stream(ctype):
                out = web.StreamResponse(status=answer.status, headers={"content-type": ctype})
                await out.prepare(request)
                async for chunk in answer.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
            data = await answer.read()
            return web.Response(body=data, status=answer.status, headers={"content-type": ctype})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/healthz", health)
    app.router.add_post("/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    print(f"listening on http://{host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    await session.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway.candidates", description=__doc__)
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--upstream", required=True, help="the stub, e.g. http://127.0.0.1:9000")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    import uvloop

    upstream = args.upstream.rstrip("/")
    if args.kind == "aiohttp":
        uvloop.run(_serve_aiohttp(upstream, args.host, args.port))
    else:
        uvloop.run(_serve_uvicorn(args.kind, upstream, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
