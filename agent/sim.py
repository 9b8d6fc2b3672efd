"""The ``sim`` engine: a small OpenAI-compatible server that produces synthetic text.

It lets a cluster without cards or weights be run and tested end to end: the
agent starts it like any engine (``python -m agent.sim --port N --model M``),
its ``/health`` tells when it is ready, and clients speak the OpenAI API to
it (``/v1/models``, ``/v1/chat/completions``, with ``stream: true`` as
server-sent events). The text is made up, deterministically from the prompt,
so tests can compare answers; a model is served by sim only when every one
of its profiles is sim (the catalog's ``simulated``), so this text is never
passed off as a real model's.

Flags for tests and demos: ``--startup-delay`` (seconds before it listens,
as a real engine loading weights), ``--exit-after`` and ``--exit-code`` (it
dies on its own, to show a failure), ``--max-model-len`` (listed in ``/v1/models``
as vLLM lists it, so the agent's reading of an engine's context can be tested).

A replica spanning nodes runs one sim process per node, with vLLM's flags
(``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port``,
``--headless`` on the workers) and vLLM's behaviour where an operator sees it:
the head answers ``/health`` only once every worker has joined it at the
master port, and the gang dies together, as a tensor-parallel group does when
one rank's connection breaks: a worker that loses the head exits, and so does
a head that loses a worker.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

# The synthetic vocabulary; answers are drawn from it.
_TEXT = (
    "the cluster placed this replica on a node and its agent started a simulated engine "
    "which answers with synthetic text so that routing and scheduling can be tested "
    "without cards or weights"
)
WORDS = tuple(_TEXT.split(" "))
MAX_BODY = 1 << 20
DEFAULT_MAX_TOKENS = 16
MAX_TOKENS = 4096


def synthetic(prompt: str, n: int) -> list[str]:
    """``n`` words chosen by the prompt's digest: the same prompt, the same answer."""
    seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big")
    return [WORDS[(seed + i * 7) % len(WORDS)] for i in range(n)]


def _error(status: int, message: str, kind: str = "invalid_request_error") -> Any:
    # The OpenAI error shape, so an SDK shows the message.
    return JSONResponse({"error": {"message": message, "type": kind, "code": None}}, status)


def create_app(
    model: str,
    token_delay: float = 0.0,
    gang_ready: threading.Event | None = None,
    max_model_len: int | None = None,
) -> FastAPI:
    app = FastAPI(title=f"sim engine: {model}", docs_url=None, redoc_url=None)

    @app.get("/health", response_model=None)
    def health() -> dict[str, str] | JSONResponse:
        if gang_ready is not None and not gang_ready.is_set():
            return JSONResponse({"status": "waiting for the other nodes to join"}, 503)
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        entry: dict[str, Any] = {
            "id": model,
            "object": "model",
            "created": 0,
            "owned_by": "llmgw-sim",
        }
        if max_model_len is not None:
            entry["max_model_len"] = max_model_len  # as vLLM lists it
        return {"object": "list", "data": [entry]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        raw = await request.body()
        if len(raw) > MAX_BODY:
            return _error(413, f"the request is longer than {MAX_BODY} bytes")
        try:
            body = json.loads(raw)
            messages = body["messages"]
            prompt = " ".join(str(m.get("content", "")) for m in messages)
        except (ValueError, KeyError, TypeError, AttributeError):
            return _error(400, "the body must be JSON with a list of messages")
        if body.get("model") != model:
            return _error(
                404, f"this engine serves {model!r}, not {body.get('model')!r}", "not_found_error"
            )
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        limit = DEFAULT_MAX_TOKENS if limit is None else limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            return _error(400, "max_tokens must be a positive integer")
        words = synthetic(prompt, min(limit, MAX_TOKENS))
        ident, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        usage = {
            "prompt_tokens": len(prompt.split()),
            "completion_tokens": len(words),
            "total_tokens": len(prompt.split()) + len(words),
        }
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": " ".join(words)},
                            "finish_reason": "length",
                        }
                    ],
                    "usage": usage,
                }
            )

        def chunk(delta: dict[str, str], finish: str | None) -> str:
            data = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(data)}\n\n"

        def events() -> Iterator[str]:
            yield chunk({"role": "assistant", "content": ""}, None)
            for i, word in enumerate(words):
                time.sleep(token_delay)
                yield chunk({"content": word if i == 0 else " " + word}, None)
            yield chunk({}, "length")
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent.sim", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True, help="the model name it serves")
    p.add_argument("--startup-delay", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--token-delay", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--exit-after", type=float, default=None, metavar="SECONDS")
    p.add_argument("--exit-code", type=int, default=1)
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="the context one request may use, listed in /v1/models as vLLM lists it",
    )
    p.add_argument("--nnodes", type=int, default=1, help="nodes the replica spans")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank; 0 is the head")
    p.add_argument("--master-addr", default="127.0.0.1", help="the head's address")
    p.add_argument("--master-port", type=int, default=0, help="where the head gathers the gang")
    p.add_argument("--headless", action="store_true", help="a worker: no API of its own")
    p.add_argument("--join-timeout", type=float, default=120.0, metavar="SECONDS")
    args = p.parse_args(argv)
    print(f"sim engine: serving {args.model!r}; loading for {args.startup_delay}s", flush=True)
    time.sleep(args.startup_delay)
    if args.exit_after is not None:
        threading.Timer(args.exit_after, _die, (args.exit_code,)).start()
    if args.nnodes > 1 and args.node_rank > 0:
        return _work(args.master_addr, args.master_port, args.node_rank, args.join_timeout)
    gang_ready = None
    if args.nnodes > 1:
        gang_ready = _gather(args.host, args.master_port, args.nnodes)
    import uvicorn

    print(f"sim engine: listening on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(
        create_app(args.model, args.token_delay, gang_ready, args.max_model_len),
        host=args.host,
        port=args.port,
        log_level="warning",
    )
    return 0


def _gather(host: str, port: int, nnodes: int) -> threading.Event:
    """The head: accept a connection from each worker rank; ready once all have joined.

    The connections are held for as long as the gang runs: one that closes means
    its worker died, and the head exits, as vLLM's does when a rank is lost.
    """
    ready = threading.Event()
    listener = socket.create_server((host, port))
    print(f"sim engine: waiting for {nnodes - 1} worker(s) at port {port}", flush=True)

    def accept() -> None:
        joined: set[int] = set()
        while len(joined) < nnodes - 1:
            conn, _ = listener.accept()
            # Anyone can connect to the master port: the rank line is bounded in size and
            # in time, so a client that sends too much, or nothing, cannot stall the gang.
            conn.settimeout(5)
            try:
                line = conn.makefile("rb").readline(64).decode("ascii", "replace").split()
            except OSError:
                line = []
            if len(line) != 2 or line[0] != "rank" or not line[1].isdigit() or len(line[1]) > 6:
                conn.close()
                continue
            conn.settimeout(None)
            rank = int(line[1])
            joined.add(rank)
            print(f"sim engine: rank {rank} joined ({len(joined)} of {nnodes - 1})", flush=True)
            threading.Thread(target=_watch, args=(conn, f"rank {rank}"), daemon=True).start()
        ready.set()

    threading.Thread(target=accept, daemon=True).start()
    return ready


def _work(addr: str, port: int, rank: int, timeout: float) -> int:
    """A worker: join the head, then live exactly as long as the connection does."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                print(f"sim engine: cannot join the head at {addr}:{port}: {exc}", flush=True)
                return 1
            time.sleep(0.2)
    conn.settimeout(None)
    conn.sendall(f"rank {rank}\n".encode())
    print(f"sim engine: rank {rank} joined the head at {addr}:{port}", flush=True)
    _watch(conn, "the head")
    return 1  # not reached: _watch exits the process


def _watch(conn: socket.socket, who: str) -> None:
    while True:
        try:
            data = conn.recv(1024)
        except OSError:
            data = b""
        if not data:
            print(f"sim engine: lost {who}; the gang cannot serve without it", flush=True)
            sys.stdout.flush()
            os._exit(1)


def _die(code: int) -> None:
    print(f"sim engine: exiting with code {code} as asked (--exit-after)", flush=True)
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
