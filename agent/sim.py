"""The ``sim`` engine: a small OpenAI-compatible server that produces synthetic text.

It lets a cluster without cards or weights be run and tested end to end: the
agent starts it like any engine (``python -m agent.sim --port N --model M``),
its ``/health`` tells when it is ready, and clients speak the OpenAI API to
it (``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``, with ``stream:
true`` as server-sent events, ``/v1/embeddings``) and llama.cpp's ``/tokenize``.
The text is made up, deterministically from the prompt, so tests can compare
answers; a model is served by sim only when every one of its profiles is sim
(the catalog's ``simulated``), so this text is never passed off as a real model's.

Flags for tests, demos and load tests: ``--slots N`` (requests beyond N wait their turn,
as llama.cpp's ``--parallel``) with ``--token-delay`` (seconds per token), so latency
grows with load as on a real engine; ``--startup-delay`` (seconds before it listens,
as a real engine loading weights), ``--exit-after`` and ``--exit-code`` (it
dies on its own, to show a failure), ``--max-model-len`` (listed in ``/v1/models``
as vLLM lists it, so the agent's reading of an engine's context can be tested).

Usage as the real engines report it: every answer's ``usage`` carries
``prompt_tokens_details.cached_tokens``, the prompt's leading words found in a simulated
prefix cache (``--prefix-cache-blocks`` blocks of ``--block-size`` words, least recently
used evicted, as vLLM's automatic prefix caching keeps whole blocks), so a router's
guesses can be checked against what the engine says it reused; with ``--prefill-delay``
(seconds per prompt token not found cached, spent in the slot before the first token) a
cache hit shortens the time to the first token, as on a real engine. A stream ends with a
``usage`` chunk (``choices: []``) only when asked with ``stream_options.include_usage``,
as OpenAI's API and vLLM do.

As vLLM does, a request whose client goes away is abandoned (streamed or not, waiting
for a slot or generating): its slot is freed. ``GET /metrics`` shows it, with vLLM's
names where vLLM has one: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
and ``sim_requests_cancelled_total``; and the usage of every answer given whole,
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total`` and
``vllm:prefix_cache_hits_total`` (the cached prompt tokens), the engine's own totals a
gateway's usage ledger is held against. On SIGTERM it stops accepting and lets the
requests in flight finish (uvicorn's graceful stop), and says how many there are.

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
import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# Starlette, not FastAPI: the routes take the raw request and build their own answers,
# so FastAPI's validation and OpenAPI models were never used, and importing them cost
# ~0.2 s of CPU in every engine started (tests and demos start hundreds).
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

# The variable the sim reads its API key from (catalog.secrecy.secrets.ENGINE_KEY_VARIABLES,
# written out: importing the catalog would cost every engine started its import).
KEY_VARIABLE = "LLMGW_SIM_API_KEY"

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


@dataclass(slots=True)
class Counts:
    """Requests in each state, for ``GET /metrics`` (touched on the event loop only)."""

    running: int = 0
    waiting: int = 0
    cancelled: int = 0
    # The usage of every answer given whole (vLLM's counters of the same names): what the
    # engine itself served, for a gateway's ledger to be held against.
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0

    def answered(self, usage: dict[str, Any]) -> None:
        self.prompt_tokens += usage["prompt_tokens"]
        self.generation_tokens += usage["completion_tokens"]
        self.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]


class PrefixCache:
    """The prompt prefixes this engine holds, as whole blocks of words, least recently
    used evicted first (vLLM's automatic prefix caching keeps whole blocks of tokens and
    evicts the least recently used; llama.cpp reuses a slot's common prefix).

    A block is named by the digest of its words and of every block before it, so a block
    matches only where the whole prefix up to it matches. Memory is bounded by
    ``capacity`` blocks (a 32-byte digest each)."""

    __slots__ = ("_blocks", "block", "capacity")

    def __init__(self, capacity: int, block: int) -> None:
        self.capacity = capacity
        self.block = block
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def prefill(self, words: list[str]) -> int:
        """Take a prompt in: the leading words it found cached, then holds all of its
        whole blocks. At least the last word is always computed, as an engine computes
        the last prompt token to produce the first answer token."""
        if self.capacity <= 0 or self.block <= 0:
            return 0
        chain = hashlib.sha256()
        cached, hit = 0, True
        for start in range(0, len(words) - self.block + 1, self.block):
            chain.update("\x1f".join(words[start : start + self.block]).encode() + b"\x1e")
            key = chain.copy().digest()
            if key in self._blocks:
                # A later block can outlive an earlier one it was chained to; it is
                # touched but counts only while every block before it was found too.
                self._blocks.move_to_end(key)
                if hit:
                    cached = start + self.block
                continue
            hit = False
            self._blocks[key] = None
            if len(self._blocks) > self.capacity:
                self._blocks.popitem(last=False)
        return min(cached, max(len(words) - 1, 0))


_GONE = object()


async def _unless_gone(request: Request, work: Awaitable[Any]) -> Any:
    """``work``'s result, or ``_GONE`` (``work`` cancelled) when the client disconnects
    first. The body was read already, so the next ASGI message is the disconnect."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(gone())
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return _GONE


async def _events(
    counts: Counts,
    gate: asyncio.Semaphore | None,
    token_delay: float,
    words: list[str],
    chunk: Callable[..., str],
    *,
    chat: bool,
    usage: Callable[[], str] | None = None,
    answered: Callable[[], None] | None = None,
    prefill: float = 0.0,
) -> AsyncIterator[str]:
    """A streamed answer. The slot is taken here, after the headers, as vLLM sends them
    before the request is scheduled; Starlette cancels this generator when the client
    goes away (waiting or mid-stream), and the slot is given back."""
    stage = "waiting"
    counts.waiting += 1
    try:
        if gate is not None:
            await gate.acquire()
        counts.waiting -= 1
        counts.running += 1
        stage = "running"
        if prefill:
            # The prompt's tokens not found cached, computed in the slot before the
            # first token (as an engine's prefill holds its batch slot).
            await asyncio.sleep(prefill)
        if chat:
            yield chunk(None, None, role=True)
        for i, word in enumerate(words):
            if token_delay:
                await asyncio.sleep(token_delay)
            yield chunk(word if i == 0 else " " + word, None)
        yield chunk(None, "length")
        if usage is not None:
            yield usage()
        # Counted before the end is sent: a client that has the whole stream finds it
        # in the counters.
        if answered is not None:
            answered()
        yield "data: [DONE]\n\n"
        stage = "finished"
    finally:
        if stage == "waiting":
            counts.waiting -= 1
        else:
            counts.running -= 1
            if gate is not None:
                gate.release()
        if stage != "finished":
            counts.cancelled += 1


def synthetic(prompt: str, n: int) -> list[str]:
    """``n`` words chosen by the prompt's digest: the same prompt, the same answer."""
    seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big")
    return [WORDS[(seed + i * 7) % len(WORDS)] for i in range(n)]


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    # The OpenAI error shape, so an SDK shows the message.
    return JSONResponse({"error": {"message": message, "type": kind, "code": None}}, status)


def tokenize(text: str) -> list[int]:
    """A made-up tokenizer: one token per 4 bytes of UTF-8 or part of them (ids from the
    bytes), so a count is stable and grows with the text as a real one's does."""
    raw = text.encode("utf-8", "replace")
    return [
        int.from_bytes(raw[i : i + 4].ljust(4, b"\0"), "big") % 32000 for i in range(0, len(raw), 4)
    ]


def create_app(  # noqa: PLR0915 (the routes are closures over the model and its slots)
    model: str,
    token_delay: float = 0.0,
    gang_ready: threading.Event | None = None,
    slots: int = 0,
    max_model_len: int | None = None,
    *,
    prefix_cache_blocks: int = 4096,
    block_size: int = 16,
    prefill_delay: float = 0.0,
    api_key: str | None = None,
) -> Starlette:
    """``slots``: requests answered at once (0: no limit); the rest wait their turn, as
    on llama.cpp's ``--parallel`` or vLLM's batch limit, so latency grows with load.
    ``prefix_cache_blocks``: blocks of ``block_size`` words the prefix cache holds (0:
    none, every prompt computed whole). ``prefill_delay``: seconds per prompt token not
    found cached, spent in the slot before the first token (0: prefill is free).
    ``api_key``: every route but ``/health`` answers 401 to a request without
    ``Authorization: Bearer <api_key>``, as vLLM and llama.cpp started with a key do
    (the agent gives it as ``LLMGW_SIM_API_KEY``, from the profile's env)."""
    gate = asyncio.Semaphore(slots) if slots > 0 else None
    counts = Counts()
    cache = PrefixCache(prefix_cache_blocks, block_size)

    async def metrics(request: Request) -> Response:
        label = json.dumps(model)
        lines = [
            f"vllm:num_requests_running{{model_name={label}}} {counts.running}",
            f"vllm:num_requests_waiting{{model_name={label}}} {counts.waiting}",
            f"sim_requests_cancelled_total{{model_name={label}}} {counts.cancelled}",
            f"vllm:prompt_tokens_total{{model_name={label}}} {counts.prompt_tokens}",
            f"vllm:generation_tokens_total{{model_name={label}}} {counts.generation_tokens}",
            f"vllm:prefix_cache_hits_total{{model_name={label}}} {counts.cached_tokens}",
        ]
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    async def slot(request: Request) -> bool:
        """Wait for a slot; False when the client went away first (nothing held)."""
        counts.waiting += 1
        try:
            if gate is None:
                return True
            return await _unless_gone(request, gate.acquire()) is not _GONE
        finally:
            counts.waiting -= 1

    def release() -> None:
        if gate is not None:
            gate.release()

    async def health(request: Request) -> Response:
        if gang_ready is not None and not gang_ready.is_set():
            return JSONResponse({"status": "waiting for the other nodes to join"}, 503)
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        entry: dict[str, Any] = {
            "id": model,
            "object": "model",
            "created": 0,
            "owned_by": "llmgw-sim",
        }
        if max_model_len is not None:
            entry["max_model_len"] = max_model_len  # as vLLM lists it
        return JSONResponse({"object": "list", "data": [entry]})

    async def props(request: Request) -> Response:
        # As llama.cpp's server says its slots (``total_slots``; 0 here: no limit).
        return JSONResponse({"total_slots": max(slots, 0), "model_alias": model})

    async def read(request: Request) -> dict[str, Any] | JSONResponse:
        """The request's body, or the refusal to answer with."""
        raw = await request.body()
        if len(raw) > MAX_BODY:
            return _error(413, f"the request is longer than {MAX_BODY} bytes")
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "the body must be JSON")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        if body.get("model") != model:
            return _error(
                404, f"this engine serves {model!r}, not {body.get('model')!r}", "not_found_error"
            )
        return body

    async def tokenize_route(request: Request) -> Response:
        # llama.cpp's shape ({"content"} -> {"tokens"}); vLLM's "prompt" is read too.
        raw = await request.body()
        try:
            body = json.loads(raw)
            text = body.get("content", body.get("prompt"))
        except (ValueError, AttributeError):
            return _error(400, "the body must be JSON with `content`")
        if not isinstance(text, str):
            return _error(400, "`content` must be text")
        return JSONResponse({"tokens": tokenize(text)})

    async def embeddings(request: Request) -> Response:
        body = await read(request)
        if isinstance(body, JSONResponse):
            return body
        items = body.get("input")
        items = items if isinstance(items, list) else [items]
        data = []
        for i, item in enumerate(items):
            digest = hashlib.sha256(str(item).encode()).digest()
            data.append(
                {"object": "embedding", "index": i, "embedding": [b / 255 for b in digest[:8]]}
            )
        used = sum(len(tokenize(str(x))) for x in items)
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": used, "total_tokens": used},
            }
        )

    async def chat(request: Request) -> Response:
        body = await read(request)
        if isinstance(body, JSONResponse):
            return body
        try:
            prompt = " ".join(str(m.get("content", "")) for m in body["messages"])
        except (KeyError, TypeError, AttributeError):
            return _error(400, "the body must be JSON with a list of messages")
        return await answer(request, body, prompt, chat=True)

    async def completions(request: Request) -> Response:
        body = await read(request)
        if isinstance(body, JSONResponse):
            return body
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return _error(400, "`prompt` must be text")
        return await answer(request, body, prompt, chat=False)

    async def answer(
        request: Request, body: dict[str, Any], prompt: str, *, chat: bool
    ) -> Response:
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        limit = DEFAULT_MAX_TOKENS if limit is None else limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            return _error(400, "max_tokens must be a positive integer")
        options = body.get("stream_options")
        if options is not None and (
            not isinstance(options, dict)
            or not isinstance(options.get("include_usage", False), bool)
        ):
            return _error(400, "stream_options must be an object with a boolean include_usage")
        include_usage = bool(body.get("stream") and options and options.get("include_usage"))
        words = synthetic(prompt, min(limit, MAX_TOKENS))
        prefix = "chatcmpl" if chat else "cmpl"
        ident, created = f"{prefix}-{uuid.uuid4().hex[:24]}", int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        prompt_words = prompt.split()
        cached = cache.prefill(prompt_words)
        prefill = prefill_delay * (len(prompt_words) - cached)
        usage = {
            "prompt_tokens": len(prompt_words),
            "completion_tokens": len(words),
            "total_tokens": len(prompt_words) + len(words),
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        if not body.get("stream"):
            if not await slot(request):
                counts.cancelled += 1
                return Response(status_code=499)
            counts.running += 1
            try:
                if token_delay or prefill:
                    # As vLLM's ``with_cancellation``: a client gone stops the work.
                    work = asyncio.sleep(prefill + token_delay * len(words))
                    done = await _unless_gone(request, work)
                    if done is _GONE:
                        counts.cancelled += 1
                        return Response(status_code=499)
            finally:
                counts.running -= 1
                release()
            text = " ".join(words)
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}}
                if chat
                else {"index": 0, "text": text}
            )
            choice["finish_reason"] = "length"
            counts.answered(usage)
            return JSONResponse(
                {
                    "id": ident,
                    "object": kind,
                    "created": created,
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                }
            )

        def chunk(content: str | None, finish: str | None, role: bool = False) -> str:
            if chat:
                delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {}
                if content is not None:
                    delta["content"] = content
                part: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                part = {"index": 0, "text": content or "", "finish_reason": finish}
            data = {
                "id": ident,
                "object": f"{kind}.chunk" if chat else kind,
                "created": created,
                "model": model,
                "choices": [part],
            }
            return f"data: {json.dumps(data)}\n\n"

        def usage_chunk() -> str:
            data = {
                "id": ident,
                "object": f"{kind}.chunk" if chat else kind,
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage,
            }
            return f"data: {json.dumps(data)}\n\n"

        final = usage_chunk if include_usage else None
        events = _events(
            counts,
            gate,
            token_delay,
            words,
            chunk,
            chat=chat,
            usage=final,
            answered=lambda: counts.answered(usage),
            prefill=prefill,
        )
        return StreamingResponse(events, media_type="text/event-stream")

    app = Starlette(
        routes=[
            Route("/metrics", metrics, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/props", props, methods=["GET"]),
            Route("/tokenize", tokenize_route, methods=["POST"]),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
        ],
        exception_handlers={HTTPException: _http_error},
    )
    app.state.counts = counts
    if api_key:
        app.add_middleware(_KeyRequired, key=api_key)
    return app


class _KeyRequired:
    """401 for a request without the engine's key (``/health`` needs none, as on
    vLLM and llama.cpp: an agent's readiness check carries no key)."""

    def __init__(self, app: Any, key: str) -> None:
        self.app = app
        self.expected = b"Bearer " + key.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                refusal = JSONResponse(
                    {
                        "error": {
                            "message": "Invalid API Key",
                            "type": "authentication_error",
                            "code": 401,
                        }
                    },
                    401,
                )
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _http_error(request: Request, exc: Exception) -> Response:
    """An unknown path or method answers as vLLM's (FastAPI's) server does: JSON ``detail``."""
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent.sim", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True, help="the model name it serves")
    p.add_argument("--startup-delay", type=float, default=0.0, metavar="SECONDS")
    p.add_argument(
        "--token-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="time per generated token (streamed or not), so latency grows with the answer",
    )
    p.add_argument(
        "--slots",
        type=int,
        default=0,
        metavar="N",
        help="requests answered at once (as llama.cpp's --parallel); the rest wait; 0: no limit",
    )
    p.add_argument("--exit-after", type=float, default=None, metavar="SECONDS")
    p.add_argument("--exit-code", type=int, default=1)
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="the context one request may use, listed in /v1/models as vLLM lists it",
    )
    p.add_argument(
        "--prefix-cache-blocks",
        type=int,
        default=4096,
        metavar="N",
        help="blocks of prompt words the simulated prefix cache holds (0: no cache)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=16,
        metavar="WORDS",
        help="words in a prefix-cache block (vLLM's default block is 16 tokens)",
    )
    p.add_argument(
        "--prefill-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="time per prompt token not found in the prefix cache, before the first token",
    )
    p.add_argument("--nnodes", type=int, default=1, help="nodes the replica spans")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank; 0 is the head")
    p.add_argument("--master-addr", default="127.0.0.1", help="the head's address")
    p.add_argument("--master-port", type=int, default=0, help="where the head gathers the gang")
    p.add_argument("--headless", action="store_true", help="a worker: no API of its own")
    p.add_argument("--join-timeout", type=float, default=120.0, metavar="SECONDS")
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="time a client has to send a request's line and headers",
    )
    args = p.parse_args(argv)
    # structlog (which httpguard logs with) formats exceptions with rich whenever it can
    # import it, and importing rich cost ~0.1 s of CPU in every engine started; the sim
    # never needs it (as llmgw.cli.no_rich, for the same reason; the agent's floor may not
    # import llmgw).
    sys.modules.setdefault("rich", None)  # type: ignore[arg-type]
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

    from httpguard.limits import HeadLimits
    from httpguard.protocol import uvicorn_options

    app = create_app(
        args.model,
        args.token_delay,
        gang_ready,
        args.slots,
        args.max_model_len,
        prefix_cache_blocks=args.prefix_cache_blocks,
        block_size=args.block_size,
        prefill_delay=args.prefill_delay,
        api_key=os.environ.get(KEY_VARIABLE) or None,
    )
    counts: Counts = app.state.counts

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # Said once, so an operator (and a test) can see that a stop found requests
            # in flight and let them finish.
            if not self.should_exit:
                print(
                    f"sim engine: stopping (signal {sig}); {counts.running + counts.waiting} "
                    "request(s) in flight finish first",
                    flush=True,
                )
            super().handle_exit(sig, frame)

    print(f"sim engine: listening on http://{args.host}:{args.port}", flush=True)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        # The same bounds on a request's head as the control plane's API.
        **uvicorn_options(HeadLimits(header_timeout_s=args.header_timeout)),
    )
    Server(config).run()
    return 0


def _gather(host: str, port: int, nnodes: int) -> threading.Event:
    """The head: accept a connection from each worker rank; ready once all have joined.

    The connections are held for as long as the gang runs: one that closes means
    its worker died, and the head exits, as vLLM's does when a rank is lost.
    """
    ready = threading.Event()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family)
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
